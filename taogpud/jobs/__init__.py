"""Jobs: their records, the durable store and its log, who may touch one, and the scheduler
that admits, places and runs them (placement.py holds the pure rules)."""
