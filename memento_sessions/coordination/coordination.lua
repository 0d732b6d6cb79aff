#!lua name=memento_coord
-- The Redis Functions behind entity leases, mailboxes and the session side of fencing tokens
-- (docs/coordination.md). Each call touches the keys of one hash tag only, so it is atomic and
-- Cluster-safe: a namespace's leases share `{<ns>/coord}`, an agent's mailbox `{<ns>/agent/<id>}`,
-- and mc_fence_sync writes a session's own keys (`{<sessionId>}`).
-- Errors start with a word the Python side maps to a JSON-RPC error: NOTFOUND, FORBIDDEN, FULL <reason>.
--
-- Lease KEYS = {leases (hash leaseId -> lease JSON, which names at most the first `listed` entities it covers
--               through the graph), holds (the prefix of each entity's two hold zsets, `<holds>:x:<entityId>`
--               for exclusive holds and `<holds>:s:<entityId>` for shared ones: member `<agent>/<leaseId>/<via>`,
--               score the lease's end in ms), expiry (zset leaseId -> expiresAt ms), fence (hash entityId ->
--               newest exclusive token, field COUNTER the namespace's token counter), byagent (zset of
--               `<agentId>/<leaseId>`, all scored 0: an agent's leases are one ZRANGEBYLEX; agent ids hold no
--               '/'), alive (zset agentId -> last seen ms), covered (hash leaseId -> JSON [[entityId, via]...]
--               of everything the lease holds, or of its first part: see below), counts (hash entityId -> its
--               holds not yet removed, either mode), xcounts (hash entityId -> its exclusive holds not yet removed)}.
-- A lease of more entities than one call may touch (MEMENTO_LEASE_CALL_ENTITIES) is written in parts, one call
-- each: its covered entities are split into fields `<leaseId>` (part 1) and `<leaseId>#<k>`, field `<leaseId>#`
-- counting its parts. Until a last small call (mc_commit) grants it, it is pending: its lease JSON says
-- `"pending":true` and ends at a short deadline, and `<holds>:pending` (zset leaseId -> deadline) names it. Its
-- holds already conflict for other agents' grants (so no two grants take one entity), but no list, no hold read
-- (mc_holds) and no renew or release sees it; a grant that fails between parts is dropped by its caller, or by
-- the reaper once the deadline passes. Dropping, renewing and reaping go part by part, a bounded number a call.
-- The hold zsets share the namespace's hash tag (built from KEYS[2], so in the call's slot). A grant reads the
-- counts of all its entities in a few HMGETs; a count is never below the entity's live holds (an expired hold
-- counts until the reaper removes it), so a zero skips that entity's zsets, and only an entity with exclusive
-- holds (or, for an exclusive grant, any), or at the cap, has them read by score range. So a grant's work per
-- entity does not grow with other agents' holds on it (only with the caller's own, which
-- MEMENTO_LEASE_MAX_HOLDS bounds).

local COUNTER = '\1tokens' -- entity ids hold no control characters, so no entity is this field
local GRAPH = '\1graph' -- the fence hash's field of the namespace's graph version (coverage.py)
local KEEP = 7200 -- seconds a coordination key outlives its last write: the longest lease (3600) plus grace
local SCAN = 16 -- leases or agents the reaper reads per step
local FIRST, NEXT = 4, 64 -- holds read by the first step of a conflict check (usually enough), then by each next
local REAP_BUDGET = 256 -- holds a reap call removes (about) when its caller names no budget
local PAIRS = 12 -- mc_acquire's first ARGV of its (entity, via) pairs (ARGV[11] says how many ARGVs they take)
local PLACE_PAIRS = 14 -- mc_place's first ARGV of its pairs (ARGV[13] says how many ARGVs they take)
local PENDING = ':pending' -- `<holds>:pending`: the leases being granted in parts (zset leaseId -> deadline ms)
local CHUNK = 1000 -- fields one HMGET, HSET or HDEL names at most (unpack's limit is far above)

local function keep(keys)
  for i = 1, #keys do
    if i ~= 2 then redis.call('EXPIRE', keys[i], KEEP) end -- keys[2] names no key: it is the holds' prefix
  end
end

local function decode_list(raw)
  if not raw then return {} end
  local list = cjson.decode(raw)
  if type(list) ~= 'table' then return {} end
  return list
end

local function hold_key(keys, mode, entity)
  if mode == 'exclusive' then return keys[2] .. ':x:' .. entity end
  if mode == 'intent' then return keys[2] .. ':i:' .. entity end -- intents: no counts, never a conflict
  return keys[2] .. ':s:' .. entity
end

local function hold_member(agent, lease_id, via) return agent .. '/' .. lease_id .. '/' .. via end

-- The numbers a counts hash holds for `entities`, in order (0 where none).
local function read_counts(key, entities)
  local out = {}
  for from = 1, #entities, CHUNK do
    local part = {unpack(entities, from, math.min(from + CHUNK - 1, #entities))}
    for _, value in ipairs(redis.call('HMGET', key, unpack(part))) do table.insert(out, tonumber(value) or 0) end
  end
  return out
end

-- Writes `counts[j] + delta` for each entity j (a count that reaches 0 is removed).
local function add_counts(key, entities, counts, delta)
  local sets, dels = {}, {}
  for j, entity in ipairs(entities) do
    local value = counts[j] + delta
    if value > 0 then
      table.insert(sets, entity)
      table.insert(sets, value)
    else
      table.insert(dels, entity)
    end
    if #sets >= 2 * CHUNK then
      redis.call('HSET', key, unpack(sets))
      sets = {}
    end
    if #dels >= CHUNK then
      redis.call('HDEL', key, unpack(dels))
      dels = {}
    end
  end
  if #sets > 0 then redis.call('HSET', key, unpack(sets)) end
  if #dels > 0 then redis.call('HDEL', key, unpack(dels)) end
end

local function part_field(lease_id, part)
  if part == 1 then return lease_id end
  return lease_id .. '#' .. part
end

local function parts_of(keys, lease_id) return tonumber(redis.call('HGET', keys[7], lease_id .. '#') or '1') end

-- Removes the holds of one part of a lease and their counts; returns how many there were.
local function drop_part(keys, lease, lease_id, part)
  local field = part_field(lease_id, part)
  local covered, entities = decode_list(redis.call('HGET', keys[7], field)), {}
  for j, pair in ipairs(covered) do
    redis.call('ZREM', hold_key(keys, lease.mode, pair[1]), hold_member(lease.agentId, lease_id, pair[2]))
    entities[j] = pair[1]
  end
  if lease.mode ~= 'intent' then add_counts(keys[8], entities, read_counts(keys[8], entities), -1) end
  if lease.mode == 'exclusive' then add_counts(keys[9], entities, read_counts(keys[9], entities), -1) end
  redis.call('HDEL', keys[7], field)
  return #covered
end

-- Removes a lease's parts, last first, until `budget` holds are spent, then the lease itself once none is
-- left. Returns the holds spent (plus one for the lease) and whether the lease is gone. Idempotent: a call
-- cut short leaves a lease that the next call (or the reaper) goes on with.
local function drop(keys, lease_id, budget)
  local raw = redis.call('HGET', keys[1], lease_id)
  redis.call('ZREM', keys[2] .. PENDING, lease_id)
  if not raw then
    redis.call('ZREM', keys[3], lease_id)
    redis.call('HDEL', keys[7], lease_id, lease_id .. '#')
    return 0, true
  end
  local lease, parts, spent = cjson.decode(raw), parts_of(keys, lease_id), 0
  while parts > 0 and spent < budget do
    spent = spent + drop_part(keys, lease, lease_id, parts)
    parts = parts - 1
  end
  if parts > 0 then
    redis.call('HSET', keys[7], lease_id .. '#', parts)
    return spent, false
  end
  redis.call('ZREM', keys[3], lease_id)
  redis.call('ZREM', keys[5], lease.agentId .. '/' .. lease_id)
  redis.call('HDEL', keys[1], lease_id)
  redis.call('HDEL', keys[7], lease_id .. '#')
  return spent + 1, true
end

-- Drops expired leases until `budget` holds are spent; returns how many ended, the holds spent, and whether
-- more expired leases (or parts of one) may remain.
local function drop_expired(keys, now, budget)
  local dropped, spent = 0, 0
  while spent < budget do
    local gone = redis.call('ZRANGEBYSCORE', keys[3], '-inf', now, 'LIMIT', 0, SCAN)
    if #gone == 0 then return dropped, spent, false end
    for _, lease_id in ipairs(gone) do
      if spent >= budget then break end
      local used, done = drop(keys, lease_id, budget - spent)
      spent = spent + math.max(used, 1) -- a lease with nothing left to remove still spends: the loop always ends
      if done then dropped = dropped + 1 end
    end
  end
  return dropped, spent, true
end

-- The live holds on one zset of agents other than `agent`, latest end first, appended to `found` as
-- conflicts while it has fewer than `room`. Returns whether there is any, and whether one was left out.
-- Only the agent's own holds are stepped over: the work does not grow with other agents' holds.
local function others(key, mode, agent, now, entity, via, found, room, subject)
  local offset, any, step = 0, false, FIRST
  while true do
    local batch = redis.call('ZRANGE', key, '+inf', '(' .. now, 'BYSCORE', 'REV', 'LIMIT', offset, step)
    for _, member in ipairs(batch) do
      local holder, lease_id, held_via = string.match(member, '^([^/]*)/([^/]*)/(.*)$')
      if holder ~= agent then
        if #found >= room then return true, true end
        any = true
        local conflict = {entityId = subject or entity, heldBy = holder, leaseId = lease_id, mode = mode}
        if subject then conflict.via = entity -- a container's hold reaches the entity added to it
        elseif held_via ~= '' then conflict.via = held_via elseif via ~= '' then conflict.via = via end
        table.insert(found, conflict)
      end
    end
    if #batch < step then return any, false end
    offset, step = offset + step, NEXT
  end
end

-- The (entity, via) pairs of mc_acquire's (or mc_place's) ARGV from `first` on, each entity once, then the
-- (container, entity) pairs after them: the containers of what the lease covers, checked but not held.
local function items_of(args, first, pair_args)
  local items, seen, last = {}, {}, first + tonumber(pair_args) - 1
  for i = first, last, 2 do
    if not seen[args[i]] then
      seen[args[i]] = true
      table.insert(items, {args[i], args[i + 1]})
    end
  end
  local above = {}
  for i = last + 1, #args, 2 do table.insert(above, {args[i], args[i + 1]}) end
  return items, above
end

-- The conflicts through containers: a lease on a container holds what the graph has added to it since, so
-- another agent's hold on a container of a covered entity conflicts as if that entity were held (via it).
-- Appends to `found`; returns how many of the entities have one, and whether one was left out.
local function through(keys, agent, mode, now, room, above, found)
  local containers, seen = {}, {}
  for j, pair in ipairs(above) do containers[j] = pair[1] end
  for _, conflict in ipairs(found) do seen[conflict.leaseId .. '/' .. conflict.entityId] = true end
  local totals, exclusives = read_counts(keys[8], containers), read_counts(keys[9], containers)
  local conflicting, cut, hit = 0, false, {}
  for j, pair in ipairs(above) do
    local got, left, left_shared, _ = {}, false, false, nil
    if exclusives[j] > 0 then
      _, left = others(hold_key(keys, 'exclusive', pair[1]), 'exclusive', agent, now, pair[1], '', got, room, pair[2])
    end
    if mode == 'exclusive' and totals[j] > exclusives[j] then
      _, left_shared = others(hold_key(keys, 'shared', pair[1]), 'shared', agent, now, pair[1], '', got, room, pair[2])
    end
    for _, conflict in ipairs(got) do -- a lease already found on the entity itself (it covered it) is not doubled
      local key = conflict.leaseId .. '/' .. conflict.entityId
      if not seen[key] then
        seen[key] = true
        if #found >= room then cut = true else table.insert(found, conflict) end
        if not hit[pair[2]] then
          hit[pair[2]] = true
          conflicting = conflicting + 1
        end
      end
    end
    cut = cut or left or left_shared
  end
  return conflicting, cut
end

-- A hold conflicts when another agent holds it and either side is exclusive. Returns the listed conflicts
-- (at most `room`), how many entities have one, whether any was left out, the first entity already held
-- MEMENTO_LEASE_MAX_HOLDS times (nil when none), and the entities with their two counts (for the grant).
local function survey(keys, agent, mode, now, room, max_holds, items)
  local entities = {}
  for j, item in ipairs(items) do entities[j] = item[1] end
  local totals, exclusives = read_counts(keys[8], entities), read_counts(keys[9], entities)
  local found, conflicting, cut, full, from = {}, 0, false, nil, '(' .. now
  for j, item in ipairs(items) do
    local entity, via, any, left = item[1], item[2], false, false
    if totals[j] > 0 then
      local xkey, skey = hold_key(keys, 'exclusive', entity), hold_key(keys, 'shared', entity)
      if exclusives[j] > 0 then any, left = others(xkey, 'exclusive', agent, now, entity, via, found, room) end
      if mode == 'exclusive' and totals[j] > exclusives[j] then
        local any_shared, left_shared = others(skey, 'shared', agent, now, entity, via, found, room)
        any, left = any or any_shared, left or left_shared
      end
      if not full and totals[j] >= max_holds and
         redis.call('ZCOUNT', xkey, from, '+inf') + redis.call('ZCOUNT', skey, from, '+inf') >= max_holds then
        full = entity
      end
    end
    if any then conflicting = conflicting + 1 end
    cut = cut or left
  end
  return found, conflicting, cut, full, {entities, totals, exclusives}
end

-- The JSON array of the first `room` entities held through the graph, and how many more there are.
local function covers_json(items, room)
  local shown, omitted = {}, 0
  for _, item in ipairs(items) do
    if item[2] ~= '' then
      if #shown < room then table.insert(shown, cjson.encode(item[1])) else omitted = omitted + 1 end
    end
  end
  return '[' .. table.concat(shown, ',') .. ']', omitted
end

-- One hold per item (ending at `expires`) and their counts (`counted`, as survey returns them).
local function hold_all(keys, items, counted, agent, lease_id, mode, expires)
  for _, item in ipairs(items) do
    local key = hold_key(keys, mode, item[1])
    redis.call('ZADD', key, expires, hold_member(agent, lease_id, item[2]))
    redis.call('EXPIRE', key, KEEP)
  end
  local entities, totals, exclusives = counted[1], counted[2], counted[3]
  add_counts(keys[8], entities, totals, 1)
  if mode == 'exclusive' then add_counts(keys[9], entities, exclusives, 1) end
end

-- Records `token` as the newest exclusive grant of each entity whose recorded one is older (`current`, in order;
-- nil: write it without reading).
local function raise_fences(keys, entities, token, current)
  local fences = {}
  for j, entity in ipairs(entities) do
    if not current or current[j] < token then
      table.insert(fences, entity)
      table.insert(fences, token)
    end
    if #fences >= 2 * CHUNK then
      redis.call('HSET', keys[4], unpack(fences))
      fences = {}
    end
  end
  if #fences > 0 then redis.call('HSET', keys[4], unpack(fences)) end
end

-- Writes the grant: one hold per covered entity, their counts, the lease, its end and its agent's index entry.
local function grant(keys, lease_json_tail, items, counted, agent, lease_id, mode, expires, room)
  local token = redis.call('HINCRBY', keys[4], COUNTER, 1)
  hold_all(keys, items, counted, agent, lease_id, mode, expires)
  if mode == 'exclusive' then raise_fences(keys, counted[1], token, nil) end
  local covers, omitted = covers_json(items, room)
  redis.call('HSET', keys[1], lease_id, lease_json_tail .. ',"covers":' .. covers .. ',"coversOmitted":' .. omitted ..
             ',"fencingToken":' .. token .. ',"expiresAt":' .. expires .. '}')
  redis.call('HSET', keys[7], lease_id, cjson.encode(items))
  redis.call('ZADD', keys[3], expires, lease_id)
  redis.call('ZADD', keys[5], 0, agent .. '/' .. lease_id)
  return token
end

-- An intent (a declaration of planned work): always granted, never a conflict for anyone. It writes the lease,
-- and one member per named entity in the entity's intent zset (`<holds>:i:<entityId>`, read by mc_overlaps),
-- no counts and no fencing token. `limits` holds mc_acquire's lease_max and max_holds as given.
local function intend(keys, now, limits, lease_json_tail, items, agent, lease_id, expires)
  local lease_max, max_holds = limits[1], limits[2]
  if redis.call('ZCOUNT', keys[3], '(' .. now, '+inf') >= tonumber(lease_max) then
    return redis.error_reply('FULL lease_limit ' .. lease_max .. ' live leases in the namespace (MEMENTO_LEASE_MAX)')
  end
  for _, item in ipairs(items) do
    if redis.call('ZCOUNT', hold_key(keys, 'intent', item[1]), '(' .. now, '+inf') >= tonumber(max_holds) then
      return redis.error_reply('FULL entity_holds ' .. item[1] .. ' already has ' .. max_holds ..
                               ' live intents (MEMENTO_LEASE_MAX_HOLDS)')
    end
  end
  for _, item in ipairs(items) do
    local key = hold_key(keys, 'intent', item[1])
    redis.call('ZADD', key, expires, hold_member(agent, lease_id, ''))
    redis.call('EXPIRE', key, KEEP)
  end
  redis.call('HSET', keys[1], lease_id, lease_json_tail .. ',"covers":[],"coversOmitted":0,"fencingToken":null,' ..
             '"expiresAt":' .. expires .. '}')
  redis.call('HSET', keys[7], lease_id, cjson.encode(items))
  redis.call('ZADD', keys[3], expires, lease_id)
  redis.call('ZADD', keys[5], 0, agent .. '/' .. lease_id)
  redis.call('ZADD', keys[6], now, agent)
  keep(keys)
  return cjson.encode({granted = true, conflicts = {}, expiresAt = expires})
end

-- ARGV: now_ms, agent, lease_id, mode, ttl_ms, lease_max, lease_json_tail, graph_version, max_holds (live
-- holds one entity may have), listed (conflicts a reply lists, covered entities a lease names), how many ARGVs
-- the pairs take, then (entity, via) pairs from PAIRS on, then (container, entity) pairs to the end. lease_json_tail is the lease's JSON without its closing brace; covers, token and
-- expiry are added here. The pairs were expanded from the graph at graph_version ('*': there is no graph):
-- when the graph has changed since, nothing is granted and the reply says `stale` (the caller expands again
-- and retries). Expired leases are left to the reaper: a grant's work is bounded by its own pairs.

local function acquire(keys, args)
  -- KEYS: the lease keys (leases, holds, expiry, fence, byagent, alive, covered, counts, xcounts)
  local now, agent, lease_id, mode, ttl = tonumber(args[1]), args[2], args[3], args[4], tonumber(args[5])
  local lease_max, lease_json_tail, graph_version, max_holds = args[6], args[7], args[8], args[9]
  local listed, pair_args = args[10], args[11]  -- the pairs start at PAIRS
  if graph_version ~= '*' and (redis.call('HGET', keys[4], GRAPH) or '') ~= graph_version then
    return cjson.encode({granted = false, stale = true})
  end
  local room, items, above = tonumber(listed), items_of(args, PAIRS, pair_args)
  if mode == 'intent' then
    return intend(keys, now, {lease_max, max_holds}, lease_json_tail, items, agent, lease_id, now + ttl)
  end
  local found, conflicting, cut, full, counted = survey(keys, agent, mode, now, room, tonumber(max_holds), items)
  local more, more_cut = through(keys, agent, mode, now, room, above, found)
  conflicting, cut = conflicting + more, cut or more_cut
  redis.call('ZADD', keys[6], now, agent)
  local reply = {conflicts = found}
  if cut then
    reply.conflictsTruncated = true
    reply.conflictingEntities = conflicting
  end
  if mode == 'exclusive' and conflicting > 0 then
    keep(keys)
    reply.granted = false
    return cjson.encode(reply)
  end
  if redis.call('ZCOUNT', keys[3], '(' .. now, '+inf') >= tonumber(lease_max) then
    return redis.error_reply('FULL lease_limit ' .. lease_max .. ' live leases in the namespace (MEMENTO_LEASE_MAX)')
  end
  if full then
    return redis.error_reply('FULL entity_holds ' .. full .. ' already has ' .. max_holds ..
                             ' live leases (MEMENTO_LEASE_MAX_HOLDS)')
  end
  local expires = now + ttl
  reply.fencingToken = grant(keys, lease_json_tail, items, counted, agent, lease_id, mode, expires, room)
  reply.granted, reply.expiresAt = true, expires
  keep(keys)
  return cjson.encode(reply)
end

-- The checks before part `part` of a grant in parts is placed: part 1 claims the lease (within lease_max) as
-- pending until `deadline`, with the next fencing token; a later part needs the lease still pending and the
-- parts before it placed. Returns an error reply or a `gone` reply, or nil to go on.
local function begin_part(keys, now, agent, lease_id, mode, lease_max, deadline, part)
  local pending = keys[2] .. PENDING
  if part > 1 then
    if redis.call('ZSCORE', pending, lease_id) and parts_of(keys, lease_id) == part - 1 then return nil end
    return cjson.encode({gone = true})
  end
  if redis.call('ZCOUNT', keys[3], '(' .. now, '+inf') >= tonumber(lease_max) then
    return redis.error_reply('FULL lease_limit ' .. lease_max .. ' live leases in the namespace (MEMENTO_LEASE_MAX)')
  end
  local token = redis.call('HINCRBY', keys[4], COUNTER, 1)
  redis.call('HSET', keys[1], lease_id, '{"agentId":' .. cjson.encode(agent) .. ',"mode":"' .. mode ..
             '","pending":true,"fencingToken":' .. token .. ',"expiresAt":' .. deadline .. '}')
  redis.call('ZADD', keys[3], deadline, lease_id)
  redis.call('ZADD', pending, deadline, lease_id)
  redis.call('EXPIRE', pending, KEEP)
  redis.call('HSET', keys[7], lease_id .. '#', 0)
  return nil
end

-- One part of a grant in parts. ARGV: now_ms, agent, lease_id, mode, expires (the lease's end, the same for
-- every part), lease_max, graph_version, max_holds, listed (conflicts it may still list), deadline (the pending
-- lease's), part (1, 2, ...), place (1: check and place; 0: only list the conflicts, after a refusal), how many
-- ARGVs the pairs take, then (entity, via) pairs from PLACE_PAIRS on, then (container, entity) pairs (those of
-- this part's entities). Checked as mc_acquire checks them; placed only when an exclusive part meets no
-- conflict. Returns {conflicts, conflictingEntities, cut, placed?} or {stale} or {gone} (the pending lease was
-- dropped: by the reaper, past its deadline).
local function place(keys, args)
  -- KEYS: the lease keys
  local now, agent, lease_id, mode, expires = tonumber(args[1]), args[2], args[3], args[4], tonumber(args[5])
  local lease_max, graph_version, max_holds, room = args[6], args[7], tonumber(args[8]), tonumber(args[9])
  local deadline, part, placing, pair_args = tonumber(args[10]), tonumber(args[11]), args[12] == '1', args[13]
  if graph_version ~= '*' and (redis.call('HGET', keys[4], GRAPH) or '') ~= graph_version then
    return cjson.encode({stale = true})
  end
  if placing then
    local refused = begin_part(keys, now, agent, lease_id, mode, lease_max, deadline, part)
    if refused then return refused end
  end
  local items, above = items_of(args, PLACE_PAIRS, pair_args)
  local found, conflicting, cut, full, counted = survey(keys, agent, mode, now, room, max_holds, items)
  local more, more_cut = through(keys, agent, mode, now, room, above, found)
  local reply = {conflicts = found, conflictingEntities = conflicting + more, cut = cut or more_cut}
  redis.call('ZADD', keys[6], now, agent)
  keep(keys)
  if not placing or (mode == 'exclusive' and reply.conflictingEntities > 0) then return cjson.encode(reply) end
  if full then
    return redis.error_reply('FULL entity_holds ' .. full .. ' already has ' .. max_holds ..
                             ' live leases (MEMENTO_LEASE_MAX_HOLDS)')
  end
  hold_all(keys, items, counted, agent, lease_id, mode, expires)
  redis.call('HSET', keys[7], part_field(lease_id, part), cjson.encode(items), lease_id .. '#', part)
  reply.placed = true
  return cjson.encode(reply)
end

-- ARGV: lease_id, part. Records the pending exclusive lease's token as the newest grant of the part's entities
-- (where no newer one is recorded), after every part is placed and before the lease is granted. Returns 1, or 0
-- when the lease is no longer pending.
local function fence(keys, args)
  -- KEYS: the lease keys
  local lease_id, part = args[1], tonumber(args[2])
  if not redis.call('ZSCORE', keys[2] .. PENDING, lease_id) then return 0 end
  local token = cjson.decode(redis.call('HGET', keys[1], lease_id)).fencingToken
  local entities = {}
  for j, pair in ipairs(decode_list(redis.call('HGET', keys[7], part_field(lease_id, part)))) do
    entities[j] = pair[1]
  end
  raise_fences(keys, entities, token, read_counts(keys[4], entities))
  return 1
end

-- ARGV: now_ms, agent, lease_id, lease_json_tail, covers (JSON array), covers_omitted, expires. Grants a pending
-- lease whose parts are all placed: its JSON, its end, its agent's index entry. Returns {granted, fencingToken,
-- expiresAt} or {gone}.
local function commit(keys, args)
  -- KEYS: the lease keys
  local now, agent, lease_id, lease_json_tail = args[1], args[2], args[3], args[4]
  local covers, omitted, expires = args[5], args[6], args[7]
  local pending = keys[2] .. PENDING
  if not redis.call('ZSCORE', pending, lease_id) then return cjson.encode({gone = true}) end
  local token = cjson.decode(redis.call('HGET', keys[1], lease_id)).fencingToken
  redis.call('HSET', keys[1], lease_id, lease_json_tail .. ',"covers":' .. covers .. ',"coversOmitted":' .. omitted ..
             ',"fencingToken":' .. token .. ',"expiresAt":' .. expires .. '}')
  redis.call('ZADD', keys[3], expires, lease_id)
  redis.call('ZREM', pending, lease_id)
  redis.call('ZADD', keys[5], 0, agent .. '/' .. lease_id)
  redis.call('ZADD', keys[6], now, agent)
  keep(keys)
  return cjson.encode({granted = true, fencingToken = token, expiresAt = tonumber(expires)})
end

-- The lease if `agent` holds it and it is live; an expired one loses one part here (the reaper does the rest).
local function owned(keys, agent, lease_id, now)
  local raw = redis.call('HGET', keys[1], lease_id)
  if not raw then return nil, redis.error_reply('NOTFOUND lease ' .. lease_id .. ' not found') end
  local lease = cjson.decode(raw)
  if lease.pending then return nil, redis.error_reply('NOTFOUND lease ' .. lease_id .. ' not found') end
  if lease.expiresAt <= now then
    drop(keys, lease_id, 1)
    return nil, redis.error_reply('NOTFOUND lease ' .. lease_id .. ' has expired')
  end
  if lease.agentId ~= agent then
    return nil, redis.error_reply('FORBIDDEN lease ' .. lease_id .. ' is held by another agent')
  end
  return raw, nil, lease
end

-- Moves one part's holds to `expires`; returns how many.
local function renew_part(keys, lease, lease_id, part, expires)
  local covered = decode_list(redis.call('HGET', keys[7], part_field(lease_id, part)))
  for _, pair in ipairs(covered) do
    local key = hold_key(keys, lease.mode, pair[1])
    redis.call('ZADD', key, 'XX', expires, hold_member(lease.agentId, lease_id, pair[2]))
    redis.call('EXPIRE', key, KEEP)
  end
  return #covered
end

-- ARGV: now_ms, agent, lease_id, ttl_ms, part. The lease's holds and expiry move to now + ttl. A lease of one
-- part is renewed whole (part 0). A lease of several parts is renewed a part a call, its last part first and
-- part 1 with the lease's own end last: part 0 only answers how many parts there are. Cut short, the lease
-- still ends at its old end, and the reaper removes every hold then, moved or not. Returns {expires, holds
-- moved, parts}; without `part` (a daemon of the version before parts), every part at once and {expires, holds}.
local function renew(keys, args)
  -- KEYS: the lease keys
  local now, agent, lease_id, ttl, part = tonumber(args[1]), args[2], args[3], args[4], tonumber(args[5] or '-1')
  local raw, err, lease = owned(keys, agent, lease_id, now)
  if err then return err end
  local expires, parts = now + tonumber(ttl), parts_of(keys, lease_id)
  if part == 0 and parts > 1 then return {0, 0, parts} end
  if part > 1 then return {expires, renew_part(keys, lease, lease_id, part, expires), parts} end
  local moved = renew_part(keys, lease, lease_id, 1, expires)
  for number = 2, (part < 0 and parts or 1) do moved = moved + renew_part(keys, lease, lease_id, number, expires) end
  -- The stored JSON ends with the expiry this Function wrote: replaced in place, nothing else re-encoded.
  local renewed = string.gsub(raw, '"expiresAt":%d+}$', '"expiresAt":' .. expires .. '}')
  redis.call('HSET', keys[1], lease_id, renewed)
  redis.call('ZADD', keys[3], expires, lease_id)
  redis.call('ZADD', keys[6], now, agent)
  keep(keys)
  if part < 0 then return {expires, moved} end
  return {expires, moved, parts}
end

-- ARGV: now_ms, agent, lease_id, budget. Ends the lease now and removes its holds while `budget` lasts: a lease
-- of several parts is first marked ended (no list shows it, no renew takes it, the reaper finishes it), then
-- mc_drop removes the parts left. Returns {holds removed (plus one for the lease once gone), 1 once gone};
-- without `budget` (a daemon of the version before parts), the whole lease at once and the holds removed.
local function release(keys, args)
  -- KEYS: the lease keys
  local now, agent, lease_id, budget = tonumber(args[1]), args[2], args[3], tonumber(args[4])
  local raw, err = owned(keys, agent, lease_id, now)
  if err then return err end
  if not budget then return (drop(keys, lease_id, math.huge)) end
  if parts_of(keys, lease_id) > 1 then
    redis.call('HSET', keys[1], lease_id, (string.gsub(raw, '"expiresAt":%d+}$', '"expiresAt":' .. now .. '}')))
    redis.call('ZADD', keys[3], now, lease_id)
  end
  local spent, done = drop(keys, lease_id, budget)
  return {spent, done and 1 or 0}
end

-- ARGV: now_ms, agent, lease_id, budget. The next parts of the agent's own lease removed while `budget` lasts:
-- a release going on, or a grant in parts given up (pending or, its answer lost, granted). Returns as
-- mc_release; a lease already gone is done.
local function drop_lease(keys, args)
  -- KEYS: the lease keys
  local agent, lease_id, budget = args[2], args[3], tonumber(args[4])
  local raw = redis.call('HGET', keys[1], lease_id)
  if raw and cjson.decode(raw).agentId ~= agent then
    return redis.error_reply('FORBIDDEN lease ' .. lease_id .. ' is held by another agent')
  end
  local spent, done = drop(keys, lease_id, budget)
  return {spent, done and 1 or 0}
end

-- Ends the leases of one agent not seen for the grace while `budget` lasts; true once it has none left.
local function drop_agent(keys, agent, budget)
  local spent, dropped = 0, 0
  while spent < budget do
    local members = redis.call('ZRANGEBYLEX', keys[5], '[' .. agent .. '/', '[' .. agent .. '/\255', 'LIMIT', 0, SCAN)
    if #members == 0 then return spent, dropped, true end
    for _, member in ipairs(members) do
      if spent >= budget then break end
      local used, done = drop(keys, string.sub(member, #agent + 2), budget - spent)
      spent = spent + math.max(used, 1)
      if done then
        dropped = dropped + 1
        redis.call('ZREM', keys[5], member) -- gone with its lease, or an entry whose lease record is missing
      end
    end
  end
  return spent, dropped, false
end

-- Ends expired leases and those of agents not seen for grace_ms (every acquire and renew marks its agent
-- seen, so each holder is in `alive`), removing about `budget` holds (a lease's parts are removed whole, each
-- at most MEMENTO_LEASE_CALL_ENTITIES). ARGV: now_ms, grace_ms, budget. Returns {expired, orphaned, more}: more
-- is 1 when the budget ran out first (the caller calls again). Pending grants past their deadline are expired.
local function reap(keys, args)
  -- KEYS: the lease keys
  local now, grace, budget = tonumber(args[1]), tonumber(args[2]), tonumber(args[3] or REAP_BUDGET)
  local expired, spent, more = drop_expired(keys, now, budget)
  local orphaned = 0
  while not more do
    local gone = redis.call('ZRANGEBYSCORE', keys[6], '-inf', '(' .. (now - grace), 'LIMIT', 0, SCAN)
    if #gone == 0 then break end
    for _, agent in ipairs(gone) do
      if spent >= budget then
        more = true
        break
      end
      local used, dropped, done = drop_agent(keys, agent, budget - spent)
      spent, orphaned = spent + used, orphaned + dropped
      if done then redis.call('ZREM', keys[6], agent) else more = true end
    end
  end
  return {expired, orphaned, more and 1 or 0}
end

-- KEYS = the lease keys; ARGV: now_ms, then entity ids. The live holds of each, as a flat list of
-- (entityId, mode, holder, leaseId, via): exclusive ones first, then shared, each by latest end. Read only;
-- an entity's zsets are read only when its counts say it has holds (most entities an emit names have none).
local function holds(keys, args)
  -- KEYS: the lease keys
  local now_ms, first = args[1], 2  -- the entity ids run from `first` to #args
  local out, from, entities = {}, '(' .. tonumber(now_ms), {}
  for i = first, #args do table.insert(entities, args[i]) end
  local totals, exclusives = read_counts(keys[8], entities), read_counts(keys[9], entities)
  local pending = keys[2] .. PENDING
  local any_pending = redis.call('ZCARD', pending) > 0 -- a grant in parts: its holds are not shown until granted
  for j, entity in ipairs(entities) do
    for _, mode in ipairs({'exclusive', 'shared'}) do
      local counted = exclusives[j]
      if mode == 'shared' then counted = totals[j] - exclusives[j] end
      local members = {}
      if counted > 0 then
        members = redis.call('ZRANGE', hold_key(keys, mode, entity), '+inf', from, 'BYSCORE', 'REV')
      end
      for _, member in ipairs(members) do
        local holder, lease_id, via = string.match(member, '^([^/]*)/([^/]*)/(.*)$')
        if not (any_pending and redis.call('ZSCORE', pending, lease_id)) then
          for _, item in ipairs({entity, mode, holder, lease_id, via}) do table.insert(out, item) end
        end
      end
    end
  end
  return out
end

-- KEYS = the lease keys; ARGV: now_ms, then entity ids. mc_holds' flat list, then each entity's live intents as
-- (entityId, 'intent', holder, leaseId, ''). Read only: an intent's overlaps in one call.
local function overlaps(keys, args)
  -- KEYS: the lease keys
  local now_ms, first = args[1], 2  -- the entity ids run from `first` to #args
  local out, from = holds(keys, args), '(' .. tonumber(now_ms)
  for i = first, #args do
    for _, member in ipairs(redis.call('ZRANGE', hold_key(keys, 'intent', args[i]), '+inf', from, 'BYSCORE', 'REV')) do
      local holder, lease_id = string.match(member, '^([^/]*)/([^/]*)/')
      for _, item in ipairs({args[i], 'intent', holder, lease_id, ''}) do table.insert(out, item) end
    end
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
  -- KEYS: the mailbox's order, messages, acked
  local id, message_json_tail, max, expires = args[1], args[2], tonumber(args[3]), tonumber(args[4])
  local channel, method, push_json_tail = args[5], args[6], args[7]
  local state = redis.call('HMGET', keys[2], id, '#', '@')
  if state[1] then return {tonumber(string.match(state[1], '^{"seq":(%d+)')), 1, 0} end
  local seq = tonumber(state[2] or '0') + 1
  local message = '{"seq":' .. seq .. ',' .. message_json_tail
  redis.call('HSET', keys[2], '#', seq, id, message)
  local pushed = push_json_tail and ('{"seq":' .. seq .. ',' .. push_json_tail) or message
  if channel ~= '' then -- '': stored only (the sender's own copy of what its reply already said)
    redis.call('PUBLISH', channel, '{"jsonrpc":"2.0","method":"' .. method .. '","params":' .. pushed .. '}')
  end
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
  -- KEYS: body, boxes, known
  local sender, content, ends, max, now = args[1], args[2], tonumber(args[3]), tonumber(args[4]), tonumber(args[5])
  local check_known, first = args[6], 7  -- the recipients run from `first` to #args
  local held = redis.call('GET', keys[1])
  if held and string.match(held, '^{"from":"([^"]*)"') ~= sender then return 'TAKEN' end
  if check_known == '1' then
    for i = first, #args do
      if not redis.call('ZSCORE', keys[3], args[i]) then return 'UNKNOWN ' .. args[i] end
    end
  end
  redis.call('ZREMRANGEBYSCORE', keys[2], '-inf', now)
  local new = 0
  for i = first, #args do
    if not redis.call('ZSCORE', keys[2], args[i]) then new = new + 1 end
  end
  if new > 0 and redis.call('ZCARD', keys[2]) + new > max then
    return redis.error_reply('FULL mailbox_limit ' .. max .. ' mailboxes in the namespace (MEMENTO_MAILBOXES_MAX)')
  end
  for i = first, #args do redis.call('ZADD', keys[2], 'GT', ends, args[i]) end
  if redis.call('EXPIRETIME', keys[2]) < ends + SLACK then redis.call('EXPIREAT', keys[2], ends + SLACK) end
  if held then -- a retry: its body lasts as long as its longest copy (a retry may give a longer ttl)
    redis.call('EXPIREAT', keys[1], ends + SLACK, 'GT')
  else
    redis.call('SET', keys[1], content, 'EXAT', ends + SLACK)
  end
  return 'OK'
end

-- ARGV: message ids. Marks those still stored as read; returns their ids. The acked set may be new (a trim
-- can empty it): it gets the mailbox's keep-until expiry.
local function ack(keys, args)
  -- KEYS: the mailbox's order, messages, acked
  local message_ids = args  -- every ARGV is a message id
  local count, acked = 0, {}
  for _, id in ipairs(message_ids) do
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
  -- KEYS: the mailbox's order, messages, acked, and its surfaced cursor
  local limit = tonumber(args[1])
  local cursor = tonumber(redis.call('GET', keys[4]) or '0')
  local found = redis.call('ZRANGEBYSCORE', keys[1], '(' .. cursor, '+inf', 'WITHSCORES', 'LIMIT', 0, limit)
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
  -- KEYS: the messages' receipt hashes, one per message id
  local agent, stage, at, channel, ends = args[1], args[2], args[3], args[4], tonumber(args[5])
  local first = 6  -- the message ids, one per key, run from `first` to #args
  local new = 0
  for i = 1, #keys do
    local id = args[first - 1 + i]
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
  -- KEYS: session hash, idempotency hash
  local first = 1  -- (entityId, token) pairs run from `first` to #args
  if redis.call('EXISTS', keys[1]) == 0 then return 0 end
  for i = first, #args, 2 do
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
  -- KEYS: fence hash
  local graph_version = args[1]
  redis.call('HSET', keys[1], GRAPH, graph_version)
  redis.call('EXPIRE', keys[1], KEEP)
  return 1
end

-- One table, one loop (the load-time sandbox has no pairs/ipairs: a numeric for it is).
local FUNCTIONS = {{'mc_acquire', acquire}, {'mc_renew', renew}, {'mc_release', release}, {'mc_reap', reap},
                   {'mc_place', place}, {'mc_fence', fence}, {'mc_commit', commit}, {'mc_drop', drop_lease},
                   {'mc_send', send}, {'mc_ack', ack}, {'mc_post', post},
                   {'mc_surface', surface}, {'mc_receipt', receipt}, {'mc_fence_sync', fence_sync},
                   {'mc_graph_changed', graph_changed}}
for i = 1, #FUNCTIONS do redis.register_function(FUNCTIONS[i][1], FUNCTIONS[i][2]) end
redis.register_function{function_name = 'mc_holds', callback = holds, flags = {'no-writes'}}
redis.register_function{function_name = 'mc_overlaps', callback = overlaps, flags = {'no-writes'}}
