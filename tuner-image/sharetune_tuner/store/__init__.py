"""Store: where records live (record files, the job's output store, write-ahead, sync, the tuning library)."""
