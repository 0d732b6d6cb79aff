"""The `memento_usage` Redis Function library: `mu_fold` folds usage ops into one session's runs and totals.

Kept as a constant beside the code that loads it (store.py), as every statement the daemon sends is.
"""

LIBRARY = """\
#!lua name=memento_usage
-- mu_fold folds usage into one session's runs and totals, atomically (store.py calls it).
-- keys: 1 session hash (must exist), 2 totals hash, 3 runs hash (run id -> row JSON), 4 order zset (run id by
--       start ms), 5 starts zset (run id by the seq of the event that started it), 6 series hash (cumulative
--       metric points last seen), 7 agents hash (each agent's share: `<agent> <source>:<field>`, `<agent> seen`,
--       `#agents`), 8 seen zset (request ids folded lately, by ms)
-- args: 1 source, 2 runs kept, 3 ttl ms, 4 series kept, 5 ops JSON, 6 the agent folding, 7 agents kept (past
--       them, a new agent's share is not kept; its usage still counts in the session's totals), 8 request id
--       ('' for none), 9 now ms, 10 window ms, 11 request ids kept
-- A request id seen within the window folds nothing (an exporter's retry of a request already folded): the
--   check and the fold are one atomic call, so a retry after any failure folds exactly what was not folded.
-- An op is {op="start"|"add"|"end"|"cum", seq?, run?, at, model?, in?, out?, cr?, cc?, tools?, calls?, cost?,
--   dur?, set?, series?, value?, field?}: "start" opens a run at a seq, "add" adds to the run (named, or the
--   latest started at or before its seq), "end" closes it (setting cost, duration or tokens the source gives
--   for the whole run), "cum" turns a cumulative metric point into what changed since the last one.
-- Returns JSON {applied: {model: {field: delta}}, new: [[run id, start ms]]} ({duplicate: true} for a request
-- seen), or false without the session.
local function fold(keys, args)
  -- KEYS: session, totals, runs, order, starts, series, agents, seen (the last two may be absent; see above)
  local session, totals, runs, order, starts, series = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6]
  local agents, seen = keys[7], keys[8]
  local source, keep, ttl, series_keep = args[1], tonumber(args[2]), tonumber(args[3]), tonumber(args[4])
  local ops_json, agent, agents_kept, request = args[5], args[6], args[7], args[8]
  local now, window, requests_kept = tonumber(args[9]), tonumber(args[10]), args[11]
  if redis.call('EXISTS', session) == 0 then return false end
  if seen and request and request ~= '' then
    redis.call('ZREMRANGEBYSCORE', seen, '-inf', now - window)
    if redis.call('ZSCORE', seen, request) then return cjson.encode({duplicate = true}) end
    redis.call('ZADD', seen, now, request)
    local extra = redis.call('ZCARD', seen) - tonumber(requests_kept)
    if extra > 0 then redis.call('ZREMRANGEBYRANK', seen, 0, extra - 1) end
    redis.call('PEXPIRE', seen, window)
  end
  local ops = cjson.decode(ops_json)
  local TOKENS = {'inputTokens', 'outputTokens', 'cacheReadTokens', 'cacheCreationTokens'}
  local SHORT = {inputTokens = 'in', outputTokens = 'out', cacheReadTokens = 'cr', cacheCreationTokens = 'cc'}
  local rows, dirty, applied, fresh = {}, {}, {}, {}
  if not agents or not agent or agent == '' then
    agent = nil
  elseif redis.call('HEXISTS', agents, agent .. ' seen') == 0 then
    if tonumber(redis.call('HGET', agents, '#agents') or '0') >= tonumber(agents_kept) then
      agent = nil
    else
      redis.call('HSET', agents, agent .. ' seen', 1)
      redis.call('HINCRBY', agents, '#agents', 1)
    end
  end

  local function bump(model, field, delta)
    if delta == 0 and field ~= 'costUsd' then return end  -- a cost of 0 is known, not unknown
    local key = model or ''
    applied[key] = applied[key] or {}
    applied[key][field] = (applied[key][field] or 0) + delta
    local incr = field == 'costUsd' and 'HINCRBYFLOAT' or 'HINCRBY'
    redis.call(incr, totals, source .. ':' .. field, delta)
    if agent then redis.call(incr, agents, agent .. ' ' .. source .. ':' .. field, delta) end
  end

  local function load(id)
    if rows[id] == nil then
      local raw = redis.call('HGET', runs, id)
      rows[id] = raw and cjson.decode(raw) or false
    end
    return rows[id]
  end

  local function open(id, at, seq)
    local row = load(id)
    if row then return row end
    row = {runId = id, source = source, startedAt = at, lastAt = at, durationMs = 0, inputTokens = 0, outputTokens = 0,
           cacheReadTokens = 0, cacheCreationTokens = 0, toolCalls = 0, apiCalls = 0}
    rows[id], dirty[id] = row, true
    redis.call('ZADD', order, at, id)
    if seq then redis.call('ZADD', starts, seq, id) end
    fresh[#fresh + 1] = {id, at}
    bump(nil, 'runs', 1)
    return row
  end

  local function run_of(op)
    if op.run then return open(op.run, op.at, nil) end
    if not op.seq then return nil end
    local found = redis.call('ZREVRANGEBYSCORE', starts, op.seq, '-inf', 'LIMIT', 0, 1)
    if #found == 0 then return nil end
    return load(found[1])
  end

  local function stretch(row, at)
    if row.fixed or not at or at <= row.lastAt then return end
    local before = row.durationMs
    row.lastAt = at
    row.durationMs = row.lastAt - row.startedAt
    bump(row.model, 'durationMs', row.durationMs - before)
  end

  local function cost(row, model, amount, replace)
    if not amount then return end
    local before = row and row.costUsd
    if row then
      if before == nil then bump(model, 'costedRuns', 1) end
      row.costUsd = replace and amount or (before or 0) + amount
    end
    bump(model, 'costUsd', (replace and before) and amount - before or amount)
  end

  local function add(op)
    local row = run_of(op)
    local model = op.model or (row and row.model) or nil
    for _, field in ipairs(TOKENS) do
      local delta = op[SHORT[field]] or 0
      if row then row[field] = row[field] + delta end
      bump(model, field, delta)
    end
    for field, short in pairs({toolCalls = 'tools', apiCalls = 'calls'}) do
      local delta = op[short] or 0
      if row then row[field] = row[field] + delta end
      bump(model, field, delta)
    end
    cost(row, model, op.cost, false)
    if row then
      if op.model then row.model = op.model end
      stretch(row, op.at)
      dirty[row.runId] = true
    end
  end

  local function finish(op)
    local row = run_of(op)
    if not row then return end
    local model = row.model
    if op.set then  -- the source's own count for the whole run replaces what its messages added up to
      for _, field in ipairs(TOKENS) do
        local value = op.set[SHORT[field]]
        if value then bump(model, field, value - row[field]); row[field] = value end
      end
    end
    cost(row, model, op.cost, true)
    if op.dur then
      bump(model, 'durationMs', op.dur - row.durationMs)
      row.durationMs, row.fixed = op.dur, true
    else
      stretch(row, op.at)
    end
    row.ended = true
    dirty[row.runId] = true
  end

  local function cumulative(op)
    local last = tonumber(redis.call('HGET', series, op.series) or '')
    if not last and redis.call('HLEN', series) >= series_keep then return end
    redis.call('HSET', series, op.series, op.value)
    local delta = op.value
    if last and op.value >= last then delta = op.value - last end
    local short = SHORT[op.field]
    if op.field == 'costUsd' then add({model = op.model, cost = delta}) elseif short then
      add({model = op.model, [short] = delta})
    end
  end

  for _, op in ipairs(ops) do
    if op.op == 'start' then open(op.run, op.at, op.seq)
    elseif op.op == 'add' then add(op)
    elseif op.op == 'end' then finish(op)
    elseif op.op == 'cum' then cumulative(op)
    end
  end
  for id in pairs(dirty) do
    if rows[id] then redis.call('HSET', runs, id, cjson.encode(rows[id])) end
  end
  local over = redis.call('ZCARD', order) - keep
  if over > 0 then
    local old = redis.call('ZRANGE', order, 0, over - 1)
    redis.call('HDEL', runs, unpack(old))
    redis.call('ZREM', order, unpack(old))
    redis.call('ZREM', starts, unpack(old))
  end
  for i = 2, math.min(#keys, 7) do
    if redis.call('EXISTS', keys[i]) == 1 then redis.call('PEXPIRE', keys[i], ttl) end
  end
  return cjson.encode({applied = applied, new = fresh})
end

redis.register_function('mu_fold', fold)
"""
