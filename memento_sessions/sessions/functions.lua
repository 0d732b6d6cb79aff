#!lua name=memento_v1
-- The Redis Functions behind every session write. Each call touches only the keys of one session
-- (one hash tag), so it is atomic and Cluster-safe. KEYS = {session hash, events zset, agents set, ids hash}.
-- Errors start with a word the Python side maps to a JSON-RPC error: NOTFOUND, CONFLICT, EXISTS, FULL
-- (FULL's second word is the reason: session_full, namespace_full).

-- How a session's frames are published: sessions/functions.py loads 'SPUBLISH' on a Redis Cluster, where the
-- session's channel is a shard channel in the session's own slot (announcements stay PUBLISH: relayed to all),
-- and counts its subscribers with 'SHARDNUMSUB' there.
local SESSION_PUBLISH = 'PUBLISH'
local SESSION_NUMSUB = 'NUMSUB'

local function refresh(keys, ttl)
  for i = 1, 4 do redis.call('EXPIRE', keys[i], ttl) end
end

local function live_session(keys)
  local state, ttl, epoch, seq = unpack(redis.call('HMGET', keys[1], 'state', 'ttl', 'epoch', 'seq'))
  if not state then return redis.error_reply('NOTFOUND session not found') end
  if state == 'completed' then return redis.error_reply('CONFLICT session is completed') end
  return {state, tonumber(ttl), epoch, tonumber(seq)}
end

-- One command over a long list of arguments, 200 at a time: Lua's C stack holds at most 8,000 values.
local function chunked(command, key, items)
  for j = 1, #items, 200 do redis.call(command, key, unpack(items, j, math.min(j + 199, #items))) end
end

-- Publishes a stored event's `session.event` frame; `member` is its ZSET member, '{"seq":N,' .. body.
-- sessions/frames.py rebuilds the same bytes for replays and reads seq and epoch by offset: change the
-- frame there too (tests/test_frames.py).
local function publish_event(channel, sid_json, epoch, seq, member)
  redis.call(SESSION_PUBLISH, channel, '{"jsonrpc":"2.0","method":"session.event","params":{"seq":' .. seq ..
    ',"epoch":"' .. epoch .. '","sessionId":' .. sid_json .. ',"event":' .. member .. '}}')
end

-- ARGV: now_ms, ttl, agent, epoch, labels_json, announce_channel, announce_frame, parent, forked_at,
-- start_body, channel, sid_json, on_idle (optional: 'suspend' is kept in the hash for the lifecycle). A non-empty start_body is stored as seq 1 in the same call, so a create
-- either makes the whole session or nothing.
local function create(keys, args)
  -- KEYS: session hash, events zset, agents set, ids hash
  local now_ms, ttl, agent, epoch, labels_json = args[1], args[2], args[3], args[4], args[5]
  local announce_channel, announce_frame, parent, forked_at = args[6], args[7], args[8], args[9]
  local start_body, channel, sid_json, on_idle = args[10], args[11], args[12], args[13]
  if redis.call('EXISTS', keys[1]) == 1 then return redis.error_reply('EXISTS session id is taken') end
  local start = start_body and start_body ~= ''
  local fields = {'state', 'working', 'seq', start and 1 or 0, 'createdAt', now_ms, 'updatedAt', now_ms,
                  'ttl', ttl, 'epoch', epoch, 'labels', labels_json, 'creator', agent}
  if parent ~= '' then
    table.insert(fields, 'parentSessionId'); table.insert(fields, parent)
    table.insert(fields, 'forkedAtSeq'); table.insert(fields, forked_at)
  end
  redis.call('HSET', keys[1], unpack(fields))
  redis.call('SADD', keys[3], agent)
  if on_idle and on_idle ~= '' then redis.call('HSET', keys[1], 'onIdle', on_idle) end
  if start then
    local member = '{"seq":1,' .. start_body
    redis.call('ZADD', keys[2], 1, member)
    publish_event(channel, sid_json, epoch, 1, member)
  end
  refresh(keys, tonumber(ttl))
  redis.call('PUBLISH', announce_channel, announce_frame)
  return epoch
end

-- Whether any connection of this server (on a Redis Cluster: of the session's shard, where the daemons
-- subscribe) listens on the session's channel. With none, an emit of ASK_FROM events or more publishes no
-- frames: a subscriber that comes later reads the stored events after its subscription is in place, so it
-- misses nothing, and a large batch does not build and send a frame per event to nobody. A call of fewer
-- events publishes without asking: for one frame, asking costs what publishing does.
local ASK_FROM = 5
local function listened(channel)
  return redis.call('PUBSUB', SESSION_NUMSUB, channel)[2] > 0
end

-- The seqs already stored under the batch's ids (one HMGET per 200), so no event needs a read of its own.
local function known_ids(keys, args, first, last)
  local ids, known = {}, {}
  for i = first, last, 3 do if args[i] ~= '' then table.insert(ids, args[i]) end end
  for j = 1, #ids, 200 do
    local last = math.min(j + 199, #ids)
    local seqs = redis.call('HMGET', keys[4], unpack(ids, j, last))
    for k = j, last do if seqs[k - j + 1] then known[ids[k]] = tonumber(seqs[k - j + 1]) end end
  end
  return known
end

-- How many of the batch's events would be stored (not replays of an id already stored or earlier in it).
local function fresh_count(args, first, last, known)
  local fresh, seen = 0, {}
  for i = first, last, 3 do
    local id = args[i]
    if id == '' then
      fresh = fresh + 1
    elseif not known[id] and not seen[id] then
      seen[id] = true
      fresh = fresh + 1
    end
  end
  return fresh
end

-- Index functions: KEYS = {namespace index}. Adds a session id unless the namespace holds max_sessions;
-- ARGV: session_id, now_ms, max_sessions. Returns 1 when added, 0 when the id was already indexed.
local function index_add(keys, args)
  -- KEYS: namespace index
  local session_id, now_ms, max_sessions = args[1], args[2], args[3]
  if redis.call('ZSCORE', keys[1], session_id) then return 0 end
  local count = redis.call('ZCARD', keys[1])
  if count >= tonumber(max_sessions) then
    return redis.error_reply('FULL namespace_full ' .. count .. ' live sessions; at most ' .. max_sessions ..
                             ' (MEMENTO_NAMESPACE_MAX_SESSIONS)')
  end
  redis.call('ZADD', keys[1], now_ms, session_id)
  return 1
end

-- Fencing (coordination/coordination.lua, docs/coordination.md): an event carrying `fencingToken` older
-- than the session's mark for one of its entities (the newest exclusive lease granted on it, copied in by
-- mc_fence_sync before the emit) is refused: FULL stale_lease, and nothing is written. The marks are
-- `!fence:<entityId>` fields of the ids hash (event ids never start with '!'). Events without the token
-- cost one plain string search, and none when the caller says that no event carries one.
local function stale_fence(keys, args, first, last, whole)
  for i = first, last, 3 do
    local body = args[i + 2]
    if string.find(body, '"fencingToken":', 1, true) then
      local event = cjson.decode(whole and body or '{' .. body)
      local token, info = tonumber(event.fencingToken), event.changeInfo
      if token and type(info) == 'table' and type(info.entityIds) == 'table' then
        for _, entity in ipairs(info.entityIds) do
          local mark = tonumber(redis.call('HGET', keys[4], '!fence:' .. entity) or '0')
          if token < mark then
            return redis.error_reply('FULL stale_lease fencing token ' .. token .. ' is older than ' .. mark ..
                                     ' on ' .. entity)
          end
        end
      end
    end
  end
end

-- ARGV: now_ms, actor, channel, sid_json, max_events, then (id, new_state, body) per event; body is the
-- event's JSON without its opening brace, so the stored member is exactly '{"seq":N,' .. body. Then, in any
-- order, optional last arguments:
-- - 'unfenced': no event carries a fencingToken, so the bodies (700 KB for a batch of 76,800 ids) are not
--   searched for one. Without it, every body is.
-- - 'from:<seq>': each event's third argument is its whole member already, '{"seq":N,' .. body, with N the
--   seq it gets if the session's seq is <seq> and every event is stored (N = seq + its place in the
--   batch, from 1). Such a member is stored as given: building 300 members of a large batch here made
--   700 KB of new Lua strings (about 1.5 ms of this one thread). A member whose guess was wrong
--   (another emit came first, or an id was stored before) is rebuilt from its body.
-- A batch that would take the session past max_events stored events writes nothing (FULL). However many
-- events it holds, a batch is one ZADD, one HSET of its ids and one of the session (fewer commands and
-- fewer copies in the AOF); only the frames go out one per event, in order.
local function options(args, first)
  local last, unfenced, from = #args, false, nil
  for _ = 1, (#args - first + 1) % 3 do
    local option = args[last]
    if option == 'unfenced' then unfenced = true end
    if string.sub(option, 1, 5) == 'from:' then from = tonumber(string.sub(option, 6)) end
    last = last - 1
  end
  return last, unfenced, from
end

local function emit(keys, args)
  -- KEYS: session hash, events zset, agents set, ids hash
  local now_ms, actor, channel, sid_json, max_events = args[1], args[2], args[3], args[4], args[5]
  local first = 6  -- the first event's id; (id, new_state, body) from there to last
  local last, unfenced, from = options(args, first)
  local live = live_session(keys)
  if live.err then return live end
  local known = known_ids(keys, args, first, last)
  local fresh = fresh_count(args, first, last, known)
  local stored = redis.call('ZCARD', keys[2])
  if fresh > 0 and stored + fresh > tonumber(max_events) then
    return redis.error_reply('FULL session_full ' .. stored .. ' events stored, ' .. fresh .. ' more; at most ' ..
                             max_events .. ' (MEMENTO_SESSION_MAX_EVENTS)')
  end
  if not unfenced then
    local stale = stale_fence(keys, args, first, last, from ~= nil)
    if stale then return stale end
  end
  local seq, state, out, members, ids = live[4], nil, {}, {}, {}
  local publish = (last - first + 1) / 3 < ASK_FROM or listened(channel)
  for i = first, last, 3 do
    local id = args[i]
    local prior = id ~= '' and known[id]
    if prior then  -- a replay of an id stored before, or earlier in this batch: its seq, nothing written
      table.insert(out, prior); table.insert(out, 1)
    else
      seq = seq + 1
      if id ~= '' then
        known[id] = seq
        table.insert(ids, id); table.insert(ids, seq)
      end
      local member, guessed = args[i + 2], from and from + (i - first) / 3 + 1
      if not from then
        member = '{"seq":' .. seq .. ',' .. member
      elseif guessed ~= seq then  -- '{"seq":' .. guessed .. ',' is cut off and the real seq put in front
        member = '{"seq":' .. seq .. ',' .. string.sub(member, #tostring(guessed) + 9)
      end
      table.insert(members, seq); table.insert(members, member)
      if publish then publish_event(channel, sid_json, live[3], seq, member) end
      table.insert(out, seq); table.insert(out, 0)
      if args[i + 1] ~= '' then state = args[i + 1] end
    end
  end
  chunked('ZADD', keys[2], members)
  chunked('HSET', keys[4], ids)
  redis.call('HSET', keys[1], 'seq', seq, 'state', state or live[1], 'updatedAt', now_ms)
  redis.call('SADD', keys[3], actor)
  refresh(keys, live[2])
  return out
end

-- Add (SADD) or remove (SREM) the agent as one of the live session's agents.
local function membership(keys, command, now_ms, agent)
  local live = live_session(keys)
  if live.err then return live end
  redis.call(command, keys[3], agent)
  redis.call('HSET', keys[1], 'updatedAt', now_ms)
  refresh(keys, live[2])
  return live
end

local function join(keys, args)
  -- KEYS: session hash, events zset, agents set, ids hash
  local now_ms, agent = args[1], args[2]
  local live = membership(keys, 'SADD', now_ms, agent)
  if live.err then return live end
  return {live[1], live[4]}
end

local function leave(keys, args)
  -- KEYS: session hash, events zset, agents set, ids hash
  local now_ms, agent = args[1], args[2]
  local live = membership(keys, 'SREM', now_ms, agent)
  if live.err then return live end
  return live[1]
end

-- Record a checkpoint; when final, complete the session and shorten every key's TTL to the grace TTL.
-- ARGV: now_ms, checkpoint_json, final (0/1), grace_ttl, channel, frame, announce_channel, announce_frame
local function checkpoint(keys, args)
  -- KEYS: session hash, events zset, agents set, ids hash
  local now_ms, checkpoint_json, final, grace_ttl = args[1], args[2], args[3], args[4]
  local channel, frame, announce_channel, announce_frame = args[5], args[6], args[7], args[8]
  local state = redis.call('HGET', keys[1], 'state')
  if not state then return redis.error_reply('NOTFOUND session not found') end
  redis.call('HSET', keys[1], 'lastCheckpoint', checkpoint_json, 'updatedAt', now_ms)
  if final == '1' then
    redis.call('HSET', keys[1], 'state', 'completed')
    refresh(keys, tonumber(grace_ttl))
  end
  redis.call(SESSION_PUBLISH, channel, frame)
  redis.call('PUBLISH', announce_channel, announce_frame)
  return state
end

redis.register_function('ms_create', create)
redis.register_function('ms_emit', emit)
redis.register_function('ms_join', join)
redis.register_function('ms_leave', leave)
redis.register_function('ms_checkpoint', checkpoint)
redis.register_function('ms_index_add', index_add)

-- ===== Event sourcing and lifecycle (docs/compaction.md, docs/lifecycle.md) =====
-- Snapshots live in the session's ids hash (keys[4]) under fields `~snap:<seq>` (no client id can start
-- with `~`), with `~snaps` listing their seqs in order: they share the session's hash tag and every TTL
-- refresh of its keys, and a suspend or fork copies them with the ids.

local function snap_seqs(keys)
  local list, out = redis.call('HGET', keys[4], '~snaps'), {}
  if list then for s in string.gmatch(list, '%d+') do table.insert(out, tonumber(s)) end end
  return out
end

-- ARGV: at_seq. Returns {seq, data} of the newest snapshot at or before at_seq, or {0, ''}.
local function snapshot_at(keys, args)
  -- KEYS: session hash, events zset, agents set, ids hash
  local at_seq = args[1]
  local at, best = tonumber(at_seq), 0
  for _, s in ipairs(snap_seqs(keys)) do if s <= at and s > best then best = s end end
  if best == 0 then return {0, ''} end
  return {best, redis.call('HGET', keys[4], '~snap:' .. best)}
end

-- Keep at most `cap` snapshots and at most `max_bytes` of them (MEMENTO_SNAPSHOT_MAX_BYTES; absent: no byte
-- bound): drop the oldest, but never the newest one at or below compacted (the base every rehydration of
-- the compacted range needs) nor the newest of all (the one just stored).
local function trim_snapshots(keys, seqs, cap, compacted, max_bytes)
  local keep, sizes, total = 0, {}, 0
  for _, s in ipairs(seqs) do
    if s <= compacted and s > keep then keep = s end
    sizes[s] = redis.call('HSTRLEN', keys[4], '~snap:' .. s)
    total = total + sizes[s]
  end
  local i = 1
  while (#seqs > cap or (max_bytes and total > max_bytes)) and i < #seqs do
    if seqs[i] == keep then
      i = i + 1
    else
      redis.call('HDEL', keys[4], '~snap:' .. seqs[i])
      total = total - sizes[seqs[i]]
      table.remove(seqs, i)
    end
  end
  return seqs
end

-- Store a snapshot of the folded state at `seq`, folded from the snapshot at `base` plus the events after
-- it; with compact = 1 also remove the events up to `seq` and record compactedSeq, then publish.
-- ARGV: now_ms, seq, base, data, compact, max_snapshots, channel, frame, announce_channel, announce_frame,
-- max_bytes (optional).
-- RETRY when a compaction removed events after `base` meanwhile (the fold may have missed some).
local function snapshot(keys, args)
  -- KEYS: session hash, events zset, agents set, ids hash
  local now_ms, seq, base, data, compact = args[1], tonumber(args[2]), tonumber(args[3]), args[4], args[5]
  local max_snapshots, channel, frame = tonumber(args[6]), args[7], args[8]
  local announce_channel, announce_frame, max_bytes = args[9], args[10], tonumber(args[11])
  local cur, compacted = unpack(redis.call('HMGET', keys[1], 'seq', 'compactedSeq'))
  if not cur then return redis.error_reply('NOTFOUND session not found') end
  compacted = tonumber(compacted or 0)
  if seq > tonumber(cur) then return redis.error_reply('CONFLICT snapshot beyond the session seq') end
  if compacted > base then return redis.error_reply('RETRY compacted meanwhile') end
  local seqs, present = snap_seqs(keys), false
  for _, s in ipairs(seqs) do if s == seq then present = true end end
  if not present then table.insert(seqs, seq); table.sort(seqs) end
  redis.call('HSET', keys[4], '~snap:' .. seq, data)
  local removed = 0
  if compact == '1' and seq > compacted then
    removed = redis.call('ZREMRANGEBYSCORE', keys[2], '-inf', seq)
    redis.call('HSET', keys[1], 'compactedSeq', seq)
    compacted = seq
  end
  seqs = trim_snapshots(keys, seqs, max_snapshots, compacted, max_bytes)
  redis.call('HSET', keys[4], '~snaps', table.concat(seqs, ' '))
  local pttl = redis.call('PTTL', keys[1])
  if pttl > 0 then redis.call('PEXPIRE', keys[4], pttl) end
  if removed > 0 then
    redis.call(SESSION_PUBLISH, channel, frame)
    redis.call('PUBLISH', announce_channel, announce_frame)
  end
  return removed
end

-- A whole session (a fork, or a suspended one coming back) is written a chunk at a time (lifecycle/streams.py):
-- ms_stage calls fill its events, ids and agents while it has no hash, so no reader or writer sees it (each
-- treats a session without its hash as absent); one ms_restore call then writes the hash and publishes.
-- The ids hash carries the writer's token in field `~staging` meanwhile: a write that another took over
-- stops (RETRY), and staged keys expire with the TTL given if the writer never finishes.
-- ARGV: token, ttl, start ('1': the id must be free, leftovers of a cut-short write are cleared), kind
-- ('z': seq/member pairs of events, 'h': field/value pairs of the ids hash, 'a': agents), items.
local function stage(keys, args)
  -- KEYS: session hash, events zset, agents set, ids hash
  local token, ttl, start, kind = args[1], tonumber(args[2]), args[3], args[4]
  local first = 5  -- the first item; items run from there to #args
  if redis.call('EXISTS', keys[1]) == 1 then return redis.error_reply('EXISTS session id is taken') end
  if start == '1' then
    redis.call('DEL', keys[2], keys[3], keys[4])
  elseif redis.call('HGET', keys[4], '~staging') ~= token then
    return redis.error_reply('RETRY another write of this session took over')
  end
  redis.call('HSET', keys[4], '~staging', token)
  local command = ({z = 'ZADD', h = 'HSET', a = 'SADD'})[kind]
  local key = ({z = keys[2], h = keys[4], a = keys[3]})[kind]
  if command then
    for j = first, #args, 200 do redis.call(command, key, unpack(args, j, math.min(j + 199, #args))) end
  end
  for i = 2, 4 do redis.call('EXPIRE', keys[i], ttl) end
  return 1
end

-- ARGV: mode ('fork' | 'resume'), ttl, token, channel, frame, announce_channel, announce_frame, then the
-- field/value pairs of the hash. A resume that finds the same session (epoch and seq) live already returns 0.
local function restore(keys, args)
  -- KEYS: session hash, events zset, agents set, ids hash
  local mode, ttl, token, channel, frame = args[1], tonumber(args[2]), args[3], args[4], args[5]
  local announce_channel, announce_frame = args[6], args[7]
  local first = 8  -- the first field of the hash; field/value pairs run from there to #args
  if redis.call('EXISTS', keys[1]) == 1 then
    if mode ~= 'resume' then return redis.error_reply('EXISTS session id is taken') end
    local epoch, seq = unpack(redis.call('HMGET', keys[1], 'epoch', 'seq'))
    local same = 0
    for j = first, #args, 2 do
      if (args[j] == 'epoch' and args[j + 1] == epoch) or (args[j] == 'seq' and args[j + 1] == seq) then
        same = same + 1
      end
    end
    if same == 2 then return 0 end
    return redis.error_reply('CONFLICT session is active')
  end
  if redis.call('HGET', keys[4], '~staging') ~= token then
    return redis.error_reply('RETRY another write of this session took over')
  end
  redis.call('HDEL', keys[4], '~staging')
  for j = first, #args, 200 do redis.call('HSET', keys[1], unpack(args, j, math.min(j + 199, #args))) end
  refresh(keys, ttl)
  redis.call(SESSION_PUBLISH, channel, frame)
  redis.call('PUBLISH', announce_channel, announce_frame)
  return 1
end

-- Remove a session that is now whole in Postgres, only if it is still the copy that was stored there: the
-- same epoch, seq, updatedAt, compactedSeq and snapshots. ARGV: epoch, seq, updatedAt, compactedSeq, snaps,
-- channel, frame, announce_channel, announce_frame. Returns 1 when removed, 0 when gone.
local function suspend(keys, args)
  -- KEYS: session hash, events zset, agents set, ids hash
  local epoch, seq, updated_at, compacted_seq, snaps = args[1], args[2], args[3], args[4], args[5]
  local channel, frame, announce_channel, announce_frame = args[6], args[7], args[8], args[9]
  local stored = {epoch, seq, updated_at, compacted_seq, snaps}
  local now = redis.call('HMGET', keys[1], 'epoch', 'seq', 'updatedAt', 'compactedSeq')
  if not now[1] then return 0 end
  now[5] = redis.call('HGET', keys[4], '~snaps')
  for i = 1, 5 do
    if (now[i] or '') ~= stored[i] then return redis.error_reply('RETRY the session moved on') end
  end
  redis.call('DEL', keys[1], keys[2], keys[3], keys[4])
  redis.call(SESSION_PUBLISH, channel, frame)
  redis.call('PUBLISH', announce_channel, announce_frame)
  return 1
end

-- Remove a session just made under an id that Postgres turned out to hold, only if it is still that
-- session (ARGV: its epoch). Returns 1 when removed.
local function withdraw(keys, args)
  -- KEYS: session hash, events zset, agents set, ids hash
  local epoch = args[1]
  if redis.call('HGET', keys[1], 'epoch') ~= epoch then return 0 end
  redis.call('DEL', keys[1], keys[2], keys[3], keys[4])
  return 1
end

-- A failover lost writes whose frames were already published (a subscriber heard seqs the session no longer
-- holds): the session goes on in a new epoch, so no seq is handed out twice within one epoch. Moves the epoch
-- only if it is still the one the caller found rewound (ARGV: that epoch, the new one), so daemons that find
-- the same rewind together move it once. Returns the epoch of now.
local function rewind(keys, args)
  -- KEYS: session hash, events zset, agents set, ids hash
  local rewound_epoch, new_epoch = args[1], args[2]
  local epoch = redis.call('HGET', keys[1], 'epoch')
  if not epoch then return redis.error_reply('NOTFOUND session not found') end
  if epoch ~= rewound_epoch then return epoch end
  redis.call('HSET', keys[1], 'epoch', new_epoch)
  return new_epoch
end

redis.register_function{function_name='ms_snapshot_at', callback=snapshot_at, flags={'no-writes'}}
redis.register_function('ms_snapshot', snapshot)
redis.register_function('ms_stage', stage)
redis.register_function('ms_restore', restore)
redis.register_function('ms_suspend', suspend)
redis.register_function('ms_withdraw', withdraw)
redis.register_function('ms_rewind', rewind)
