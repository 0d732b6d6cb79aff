"""What lasts after a session: the checkpoint summary, KG anchors, failure snapshots and their retention.

checkpointer.py, triggers.py (when a checkpoint is due), aggregate.py, anchors.py, snapshots.py, pending.py,
retention.py, methods.py
(`session.checkpoint`), commands.py (`memento-sessions prune`).

May import the shared ground, sessions/ and kg/; not bridge/ or anything above.
"""
