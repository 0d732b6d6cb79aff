"""What the agents cost: tokens, tool calls, time and money per run, session, agent and namespace.

fold.py (stored events as usage ops: runs opened, usage added, runs ended), library.py (the
`memento_usage` Function that folds ops into a session's runs and totals), store.py (writes: the Function call, then the
agent's and namespace's totals and the metrics), query.py (reads: totals and pages of runs), methods.py
(`usage.get` and the step after every emit), otlp.py (OTLP logs and metrics as usage ops), receiver.py
(`POST /v1/logs` and `/v1/metrics`).

May import the shared ground (the package root) and ingest/; nothing above. docs/usage.md says why.
"""
