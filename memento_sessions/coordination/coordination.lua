#!lua name=memento_coord
-- The Redis Functions behind entity leases, mailboxes and the session side of fencing tokens
-- (docs/coordination.md). Each call touches the keys of one hash tag only, so it is atomic and
-- Cluster-safe: a namespace's leases share `{<ns>/coord}`, an agent's mailbox `{<ns>/agent/<id>}`,
-- and mc_fence_sync writes a session's own keys (`{<sessionId>}`).
-- Errors start with a word the Python side maps to a JSON-RPC error: NOTFOUND, FORBIDDEN, FULL <reason>.
--
-- Lease KEYS = {leases (hash leaseId -> lease JSON), holds (hash entityId -> JSON list of holds),
--               expiry (zset leaseId -> expiresAt ms), fence (hash entityId -> newest exclusive token,
--               field COUNTER the namespace's token counter), byagent (zset of `<agentId>/<leaseId>`, all
--               scored 0: an agent's leases are one ZRANGEBYLEX; agent ids hold no '/'),
--               alive (zset agentId -> last seen ms)}.

local COUNTER = '\1tokens' -- entity ids hold no control characters, so no entity is this field
local GRAPH = '\1graph' -- the fence hash's field of the namespace's graph version (coverage.py)
local KEEP = 7200 -- seconds a coordination key outlives its last write: the longest lease (3600) plus grace

local function keep(keys)
  for i = 1, #keys do redis.call('EXPIRE', keys[i], KEEP) end
end

local function decode_list(raw)
  if not raw then return {} end
  local list = cjson.decode(raw)
  if type(list) ~= 'table' then return {} end
  return list
end

-- cjson encodes an empty table as {}; holds and lease lists are arrays, so an empty one is deleted instead.
local function store_list(key, field, list)
  if #list == 0 then redis.call('HDEL', key, field) else redis.call('HSET', key, field, cjson.encode(list)) end
end

local function without(list, id)
  local kept = {}
  for _, item in ipairs(list) do
    if item ~= id and (type(item) ~= 'table' or item.id ~= id) then table.insert(kept, item) end
  end
  return kept
end

-- Removes one lease from every structure; returns its JSON (or nil when it did not exist).
local function drop(keys, lease_id)
  local raw = redis.call('HGET', keys[1], lease_id)
  redis.call('ZREM', keys[3], lease_id)
  if not raw then return nil end
  local lease = cjson.decode(raw)
  for _, pair in ipairs(lease.covered) do
    store_list(keys[2], pair[1], without(decode_list(redis.call('HGET', keys[2], pair[1])), lease_id))
  end
  redis.call('ZREM', keys[5], lease.agentId .. '/' .. lease_id)
  redis.call('HDEL', keys[1], lease_id)
  return raw
end

local function drop_expired(keys, now)
  local gone = redis.call('ZRANGEBYSCORE', keys[3], '-inf', now)
  for _, lease_id in ipairs(gone) do drop(keys, lease_id) end
  return #gone
end

-- A hold conflicts when another agent holds it and either side is exclusive.
local function conflicts_of(keys, agent, mode, pairs_from, args)
  local found = {}
  for i = pairs_from, #args, 2 do
    local entity, via = args[i], args[i + 1]
    for _, hold in ipairs(decode_list(redis.call('HGET', keys[2], entity))) do
      if hold.agent ~= agent and (mode == 'exclusive' or hold.mode == 'exclusive') then
        local conflict = {entityId = entity, heldBy = hold.agent, leaseId = hold.id, mode = hold.mode}
        if hold.via ~= '' then conflict.via = hold.via elseif via ~= '' then conflict.via = via end
        table.insert(found, conflict)
      end
    end
  end
  return found
end

-- ARGV: now_ms, agent, lease_id, mode, ttl_ms, lease_max, lease_json_tail, graph_version, then (entity, via)
-- pairs. lease_json_tail is the lease's JSON without its closing brace; covered, token and expiry are added
-- here. The pairs were expanded from the graph at graph_version ('*': there is no graph): when the graph has
-- changed since, nothing is granted and the reply says `stale` (the caller expands again and retries).
local function acquire(keys, args)
  local now, agent, lease_id, mode, ttl = tonumber(args[1]), args[2], args[3], args[4], tonumber(args[5])
  if args[8] ~= '*' and (redis.call('HGET', keys[4], GRAPH) or '') ~= args[8] then
    return cjson.encode({granted = false, stale = true})
  end
  drop_expired(keys, now)
  local conflicts = conflicts_of(keys, agent, mode, 9, args)
  redis.call('ZADD', keys[6], now, agent)
  if mode == 'exclusive' and #conflicts > 0 then
    keep(keys)
    return cjson.encode({granted = false, conflicts = conflicts})
  end
  if redis.call('HLEN', keys[1]) >= tonumber(args[6]) then
    return redis.error_reply('FULL lease_limit ' .. args[6] .. ' live leases in the namespace (MEMENTO_LEASE_MAX)')
  end
  local token = redis.call('HINCRBY', keys[4], COUNTER, 1)
  local expires, covered = now + ttl, {}
  for i = 9, #args, 2 do
    local entity, via = args[i], args[i + 1]
    local holds = decode_list(redis.call('HGET', keys[2], entity))
    table.insert(holds, {id = lease_id, agent = agent, mode = mode, via = via, exp = expires})
    redis.call('HSET', keys[2], entity, cjson.encode(holds))
    if mode == 'exclusive' then redis.call('HSET', keys[4], entity, token) end
    table.insert(covered, {entity, via})
  end
  redis.call('HSET', keys[1], lease_id, args[7] .. ',"covered":' .. cjson.encode(covered) .. ',"fencingToken":' ..
             token .. ',"expiresAt":' .. expires .. '}')
  redis.call('ZADD', keys[3], expires, lease_id)
  redis.call('ZADD', keys[5], 0, agent .. '/' .. lease_id)
  keep(keys)
  return cjson.encode({granted = true, conflicts = conflicts, fencingToken = token, expiresAt = expires})
end

local function owned(keys, agent, lease_id, now)
  local raw = redis.call('HGET', keys[1], lease_id)
  if not raw then return nil, redis.error_reply('NOTFOUND lease ' .. lease_id .. ' not found') end
  local lease = cjson.decode(raw)
  if lease.expiresAt <= now then
    drop(keys, lease_id)
    return nil, redis.error_reply('NOTFOUND lease ' .. lease_id .. ' has expired')
  end
  if lease.agentId ~= agent then
    return nil, redis.error_reply('FORBIDDEN lease ' .. lease_id .. ' is held by another agent')
  end
  return lease, nil
end

-- ARGV: now_ms, agent, lease_id, ttl_ms. The lease's holds and expiry move to now + ttl.
local function renew(keys, args)
  local now, agent, lease_id = tonumber(args[1]), args[2], args[3]
  local lease, err = owned(keys, agent, lease_id, now)
  if err then return err end
  local expires = now + tonumber(args[4])
  lease.expiresAt = expires
  redis.call('HSET', keys[1], lease_id, cjson.encode(lease))
  redis.call('ZADD', keys[3], expires, lease_id)
  for _, pair in ipairs(lease.covered) do
    local holds = decode_list(redis.call('HGET', keys[2], pair[1]))
    for _, hold in ipairs(holds) do if hold.id == lease_id then hold.exp = expires end end
    store_list(keys[2], pair[1], holds)
  end
  redis.call('ZADD', keys[6], now, agent)
  keep(keys)
  return expires
end

-- ARGV: now_ms, agent, lease_id
local function release(keys, args)
  local _, err = owned(keys, args[2], args[3], tonumber(args[1]))
  if err then return err end
  drop(keys, args[3])
  return 1
end

-- Ends expired leases and those of agents not seen for grace_ms (every acquire and renew marks its agent
-- seen, so each holder is in `alive`). ARGV: now_ms, grace_ms. Returns {expired, orphaned lease JSON...}.
local function reap(keys, args)
  local now, grace = tonumber(args[1]), tonumber(args[2])
  local out = {drop_expired(keys, now)}
  for _, agent in ipairs(redis.call('ZRANGEBYSCORE', keys[6], '-inf', '(' .. (now - grace))) do
    for _, member in ipairs(redis.call('ZRANGEBYLEX', keys[5], '[' .. agent .. '/', '[' .. agent .. '/\255')) do
      local raw = drop(keys, string.sub(member, #agent + 2))
      if raw then table.insert(out, raw) end
    end
    redis.call('ZREM', keys[6], agent)
  end
  return out
end

-- Mailbox KEYS = {order (zset messageId -> per-agent seq), messages (hash messageId -> message JSON, field
-- '#' the agent's seq counter, field '@' the unix second its keys are kept until), acked (set of messageIds)}.
-- ARGV: message_id, message_json_tail (the JSON after its opening `{"seq":N,`), max, until (the unix second
-- the message expires), channel, method, and optionally push_json_tail: what is pushed when it differs from
-- what is stored (a send's copy holds a reference to its body, stored once by mc_post; the push carries it).
-- A new message is also PUBLISHed on the agent's channel as a `method` notification (store and push in one
-- call). Returns {seq, duplicate (0/1), dropped}. The usual send is four commands: the dedupe, counter and
-- keep-until reads in one HMGET, one HSET, the PUBLISH and the ZADD; the keys' expiry is pushed out only
-- when a message outlives it, then SLACK further, so a busy mailbox re-arms it once a minute, not per send.
local SLACK = 60

local function keep_mailbox(keys, expires)
  local kept = expires + SLACK
  for i = 1, 3 do
    if redis.call('EXPIRETIME', keys[i]) < kept then redis.call('EXPIREAT', keys[i], kept) end -- never shortened
  end
  return kept
end

-- Drops the oldest messages past max, TRIM_CHUNK at a time (unpack's limit: a cap lowered from a million).
local TRIM_CHUNK = 1000

local function trim(keys, max)
  local excess, dropped = redis.call('ZCARD', keys[1]) - max, 0
  while excess > dropped do
    local popped, ids = redis.call('ZPOPMIN', keys[1], math.min(excess - dropped, TRIM_CHUNK)), {}
    for i = 1, #popped, 2 do table.insert(ids, popped[i]) end
    redis.call('HDEL', keys[2], unpack(ids))
    redis.call('SREM', keys[3], unpack(ids))
    dropped = dropped + #ids
  end
  return dropped
end

local function send(keys, args)
  local id, max, expires = args[1], tonumber(args[3]), tonumber(args[4])
  local state = redis.call('HMGET', keys[2], id, '#', '@')
  if state[1] then return {tonumber(string.match(state[1], '^{"seq":(%d+)')), 1, 0} end
  local seq = tonumber(state[2] or '0') + 1
  local message = '{"seq":' .. seq .. ',' .. args[2]
  redis.call('HSET', keys[2], '#', seq, id, message)
  local pushed = args[7] and ('{"seq":' .. seq .. ',' .. args[7]) or message
  redis.call('PUBLISH', args[5], '{"jsonrpc":"2.0","method":"' .. args[6] .. '","params":' .. pushed .. '}')
  redis.call('ZADD', keys[1], seq, id)
  local dropped = 0
  if seq > max then dropped = trim(keys, max) end -- at most seq messages were ever stored
  if tonumber(state[3] or '0') < expires then redis.call('HSET', keys[2], '@', keep_mailbox(keys, expires)) end
  return {seq, 0, dropped}
end

-- A send's one record before its copies. KEYS = {body, boxes (zset agentId -> until), known (zset agentId -> seen)};
-- ARGV: sender, content (the body's JSON, starting `{"from":"<sender>"`), until, mailboxes_max, now (unix
-- seconds), check_known (1: every agent must be in known), then the recipients. Claims the message id for its
-- sender (a retry by the same sender goes on; another sender's id is `TAKEN`), refuses an agent never seen
-- (`UNKNOWN <agent>`) and a send that would give the namespace more than mailboxes_max mailboxes (FULL), then
-- registers the mailboxes and stores the content once, until the message expires. Writes nothing if refused.
local function post(keys, args)
  local sender, ends, max, now = args[1], tonumber(args[3]), tonumber(args[4]), tonumber(args[5])
  local held = redis.call('GET', keys[1])
  if held and string.match(held, '^{"from":"([^"]*)"') ~= sender then return 'TAKEN' end
  if args[6] == '1' then
    for i = 7, #args do
      if not redis.call('ZSCORE', keys[3], args[i]) then return 'UNKNOWN ' .. args[i] end
    end
  end
  redis.call('ZREMRANGEBYSCORE', keys[2], '-inf', now)
  local new = 0
  for i = 7, #args do
    if not redis.call('ZSCORE', keys[2], args[i]) then new = new + 1 end
  end
  if new > 0 and redis.call('ZCARD', keys[2]) + new > max then
    return redis.error_reply('FULL mailbox_limit ' .. max .. ' mailboxes in the namespace (MEMENTO_MAILBOXES_MAX)')
  end
  for i = 7, #args do redis.call('ZADD', keys[2], 'GT', ends, args[i]) end
  if redis.call('EXPIRETIME', keys[2]) < ends + SLACK then redis.call('EXPIREAT', keys[2], ends + SLACK) end
  if held then -- a retry: its body lasts as long as its longest copy (a retry may give a longer ttl)
    redis.call('EXPIREAT', keys[1], ends + SLACK, 'GT')
  else
    redis.call('SET', keys[1], args[2], 'EXAT', ends + SLACK)
  end
  return 'OK'
end

-- ARGV: message ids. Marks those still stored as read; returns their ids. The acked set may be new (a trim
-- can empty it): it gets the mailbox's keep-until expiry.
local function ack(keys, args)
  local count, acked = 0, {}
  for _, id in ipairs(args) do
    if redis.call('ZSCORE', keys[1], id) then
      redis.call('SADD', keys[3], id)
      count = count + 1
      table.insert(acked, id)
    end
  end
  local kept = redis.call('HGET', keys[2], '@')
  if count > 0 and kept and redis.call('EXPIRETIME', keys[3]) < tonumber(kept) then
    redis.call('EXPIREAT', keys[3], kept)
  end
  return acked
end

-- What is new for an agent's context. KEYS = the mailbox's {order, messages, acked} and its surfaced cursor;
-- ARGV: limit. Returns the stored JSON of up to `limit` messages after the cursor, unacked ones only, and
-- moves the cursor past every message it looked at, in one call: two concurrent hooks of one agent never
-- surface one message twice. The cursor lives as long as the mailbox.
local function surface(keys, args)
  local cursor = tonumber(redis.call('GET', keys[4]) or '0')
  local found = redis.call('ZRANGEBYSCORE', keys[1], '(' .. cursor, '+inf', 'WITHSCORES', 'LIMIT', 0, tonumber(args[1]))
  if #found == 0 then return {} end
  local out = {}
  for i = 1, #found, 2 do
    if redis.call('SISMEMBER', keys[3], found[i]) == 0 then
      local message = redis.call('HGET', keys[2], found[i])
      if message then table.insert(out, message) end
    end
  end
  redis.call('SET', keys[4], found[#found])
  local kept = redis.call('HGET', keys[2], '@')
  if kept then redis.call('EXPIREAT', keys[4], kept) else redis.call('EXPIRE', keys[4], KEEP) end
  return out
end

-- A message's receipts (keys.mail_receipts), one stage for one recipient over several messages. KEYS = the
-- messages' receipt hashes; ARGV: agent, stage, at (ISO time), channel, until, then the message ids (one per
-- key). With a channel (the sender's, at `stored`) the hash is created and kept until `until` (unix seconds)
-- plus SLACK; without one, a message with no receipts (a conflict alert, an expired one) gets nothing. Each
-- stage keeps its first time; a new one is pushed to the sender's channel as `mailbox.receipt`. Returns how
-- many were new.
local function receipt(keys, args)
  local agent, stage, at, channel, ends = args[1], args[2], args[3], args[4], tonumber(args[5])
  local new = 0
  for i = 1, #keys do
    local id = args[5 + i]
    if channel ~= '' then
      redis.call('HSETNX', keys[i], '#channel', channel)
      if redis.call('EXPIRETIME', keys[i]) < ends + SLACK then redis.call('EXPIREAT', keys[i], ends + SLACK) end
    end
    if redis.call('EXISTS', keys[i]) == 1 and redis.call('HSETNX', keys[i], agent .. '|' .. stage, at) == 1 then
      new = new + 1
      if stage ~= 'stored' then
        local params = cjson.encode({messageId = id, agentId = agent, stage = stage, at = at})
        redis.call('PUBLISH', redis.call('HGET', keys[i], '#channel'),
                   '{"jsonrpc":"2.0","method":"mailbox.receipt","params":' .. params .. '}')
      end
    end
  end
  return new
end

-- Fencing, session side. KEYS = {session hash, idempotency hash}; ARGV: (entityId, token) pairs, the
-- newest exclusive grant of each entity. Raises the session's `!fence:<entityId>` fields (they cannot
-- collide with event ids) to those tokens, so the emit Function refuses an older one.
local function fence_sync(keys, args)
  if redis.call('EXISTS', keys[1]) == 0 then return 0 end
  for i = 1, #args, 2 do
    local field = '!fence:' .. args[i]
    local current = tonumber(redis.call('HGET', keys[2], field) or '0')
    if tonumber(args[i + 1]) > current then redis.call('HSET', keys[2], field, args[i + 1]) end
  end
  redis.call('PEXPIRE', keys[2], redis.call('PTTL', keys[1])) -- the marks live and die with the session
  return 1
end

-- KEYS = {fence hash}; ARGV: a new graph version. The namespace's graph was written: grants expanded from
-- an older version are refused from now on.
local function graph_changed(keys, args)
  redis.call('HSET', keys[1], GRAPH, args[1])
  redis.call('EXPIRE', keys[1], KEEP)
  return 1
end

-- One table, one loop (the load-time sandbox has no pairs/ipairs: a numeric for it is).
local FUNCTIONS = {{'mc_acquire', acquire}, {'mc_renew', renew}, {'mc_release', release}, {'mc_reap', reap},
                   {'mc_send', send}, {'mc_ack', ack}, {'mc_post', post},
                   {'mc_surface', surface}, {'mc_receipt', receipt}, {'mc_fence_sync', fence_sync},
                   {'mc_graph_changed', graph_changed}}
for i = 1, #FUNCTIONS do redis.register_function(FUNCTIONS[i][1], FUNCTIONS[i][2]) end
