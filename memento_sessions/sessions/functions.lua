#!lua name=memento_v1
-- The Redis Functions behind every session write. Each call touches only the keys of one session
-- (one hash tag), so it is atomic and Cluster-safe. KEYS = {session hash, events zset, agents set, ids hash}.
-- Errors start with a word the Python side maps to a JSON-RPC error: NOTFOUND, CONFLICT, EXISTS, FULL
-- (FULL's second word is the reason: session_full, namespace_full).

-- How a session's frames are published: sessions/store.py loads 'SPUBLISH' on a Redis Cluster, where the
-- session's channel is a shard channel in the session's own slot (announcements stay PUBLISH: relayed to all).
local SESSION_PUBLISH = 'PUBLISH'

local function refresh(keys, ttl)
  for i = 1, 4 do redis.call('EXPIRE', keys[i], ttl) end
end

local function live_session(keys)
  local state, ttl, epoch = unpack(redis.call('HMGET', keys[1], 'state', 'ttl', 'epoch'))
  if not state then return redis.error_reply('NOTFOUND session not found') end
  if state == 'completed' then return redis.error_reply('CONFLICT session is completed') end
  return {state, tonumber(ttl), epoch}
end

-- Stores one event and publishes its `session.event` frame. sessions/frames.py rebuilds the same bytes
-- for replays and reads seq and epoch by offset: change the frame there too (tests/test_frames.py).
local function emit_one(keys, sid_json, epoch, channel, id, body)
  if id ~= '' then
    local prior = redis.call('HGET', keys[4], id)
    if prior then return tonumber(prior), 1 end
  end
  local seq = redis.call('HINCRBY', keys[1], 'seq', 1)
  if id ~= '' then redis.call('HSET', keys[4], id, seq) end
  local member = '{"seq":' .. seq .. ',' .. body
  redis.call('ZADD', keys[2], seq, member)
  redis.call(SESSION_PUBLISH, channel,
    '{"jsonrpc":"2.0","method":"session.event","params":{"seq":' .. seq .. ',"epoch":"' .. epoch ..
    '","sessionId":' .. sid_json ..
    ',"event":' .. member .. '}}')
  return seq, 0
end

-- ARGV: now_ms, ttl, agent, epoch, labels_json, announce_channel, announce_frame, parent, forked_at,
-- start_body, channel, sid_json. A non-empty start_body is stored as seq 1 in the same call, so a create
-- either makes the whole session or nothing.
local function create(keys, args)
  if redis.call('EXISTS', keys[1]) == 1 then return redis.error_reply('EXISTS session id is taken') end
  local fields = {'state', 'working', 'seq', 0, 'createdAt', args[1], 'updatedAt', args[1], 'ttl', args[2],
                  'epoch', args[4], 'labels', args[5], 'creator', args[3]}
  if args[8] ~= '' then
    table.insert(fields, 'parentSessionId'); table.insert(fields, args[8])
    table.insert(fields, 'forkedAtSeq'); table.insert(fields, args[9])
  end
  redis.call('HSET', keys[1], unpack(fields))
  redis.call('SADD', keys[3], args[3])
  if args[10] and args[10] ~= '' then emit_one(keys, args[12], args[4], args[11], '', args[10]) end
  refresh(keys, tonumber(args[2]))
  redis.call('PUBLISH', args[6], args[7])
  return args[4]
end

-- How many of the batch's events would be stored (not replays of an id already stored or earlier in it).
local function fresh_count(keys, args)
  local fresh, seen = 0, {}
  for i = 6, #args, 3 do
    local id = args[i]
    if id == '' then
      fresh = fresh + 1
    elseif not seen[id] then
      seen[id] = true
      if redis.call('HEXISTS', keys[4], id) == 0 then fresh = fresh + 1 end
    end
  end
  return fresh
end

-- Index functions: KEYS = {namespace index}. Adds a session id unless the namespace holds max_sessions;
-- ARGV: session_id, now_ms, max_sessions. Returns 1 when added, 0 when the id was already indexed.
local function index_add(keys, args)
  if redis.call('ZSCORE', keys[1], args[1]) then return 0 end
  local count = redis.call('ZCARD', keys[1])
  if count >= tonumber(args[3]) then
    return redis.error_reply('FULL namespace_full ' .. count .. ' live sessions; at most ' .. args[3] ..
                             ' (MEMENTO_NAMESPACE_MAX_SESSIONS)')
  end
  redis.call('ZADD', keys[1], args[2], args[1])
  return 1
end

-- ARGV: now_ms, actor, channel, sid_json, max_events, then (id, new_state, body) per event; body is the
-- event's JSON without its opening brace, so the stored member is exactly '{"seq":N,' .. body.
-- A batch that would take the session past max_events stored events writes nothing (FULL).
local function emit(keys, args)
  local live = live_session(keys)
  if live.err then return live end
  local fresh = fresh_count(keys, args)
  local stored = redis.call('ZCARD', keys[2])
  if fresh > 0 and stored + fresh > tonumber(args[5]) then
    return redis.error_reply('FULL session_full ' .. stored .. ' events stored, ' .. fresh .. ' more; at most ' ..
                             args[5] .. ' (MEMENTO_SESSION_MAX_EVENTS)')
  end
  local state = nil
  local out = {}
  for i = 6, #args, 3 do
    local seq, dup = emit_one(keys, args[4], live[3], args[3], args[i], args[i + 2])
    table.insert(out, seq); table.insert(out, dup)
    if dup == 0 and args[i + 1] ~= '' then state = args[i + 1] end
  end
  if state then
    redis.call('HSET', keys[1], 'state', state, 'updatedAt', args[1])
  else
    redis.call('HSET', keys[1], 'updatedAt', args[1])
  end
  redis.call('SADD', keys[3], args[2])
  refresh(keys, live[2])
  return out
end

-- Add (SADD) or remove (SREM) args[2] as an agent of the live session; ARGV: now_ms, agent
local function membership(keys, args, command)
  local live = live_session(keys)
  if live.err then return live end
  redis.call(command, keys[3], args[2])
  redis.call('HSET', keys[1], 'updatedAt', args[1])
  refresh(keys, live[2])
  return live
end

local function join(keys, args)
  local live = membership(keys, args, 'SADD')
  if live.err then return live end
  return {live[1], redis.call('HGET', keys[1], 'seq')}
end

local function leave(keys, args)
  local live = membership(keys, args, 'SREM')
  if live.err then return live end
  return live[1]
end

-- Record a checkpoint; when final, complete the session and shorten every key's TTL to the grace TTL.
-- ARGV: now_ms, checkpoint_json, final (0/1), grace_ttl, channel, frame, announce_channel, announce_frame
local function checkpoint(keys, args)
  local state = redis.call('HGET', keys[1], 'state')
  if not state then return redis.error_reply('NOTFOUND session not found') end
  redis.call('HSET', keys[1], 'lastCheckpoint', args[2], 'updatedAt', args[1])
  if args[3] == '1' then
    redis.call('HSET', keys[1], 'state', 'completed')
    refresh(keys, tonumber(args[4]))
  end
  redis.call(SESSION_PUBLISH, args[5], args[6])
  redis.call('PUBLISH', args[7], args[8])
  return state
end

redis.register_function('ms_create', create)
redis.register_function('ms_emit', emit)
redis.register_function('ms_join', join)
redis.register_function('ms_leave', leave)
redis.register_function('ms_checkpoint', checkpoint)
redis.register_function('ms_index_add', index_add)
