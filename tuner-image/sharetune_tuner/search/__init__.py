"""Search: how a shard's tasks are split and searched (the partition over clients, each task's capped strategy)."""
