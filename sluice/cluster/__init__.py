"""A replica group on etcd: leadership, the in-sync set and fencing in etcd, the commit log
shipped from the leader to its followers (DESIGN.md, "Replication")."""
