"""Storage quotas and retention: what each owner stores, what they may store, and the
sweeper that removes threads nobody touched for `retention.thread_days`."""
