"""What lasts after a session: the checkpoint summary, KG anchors, failure snapshots and their retention."""
