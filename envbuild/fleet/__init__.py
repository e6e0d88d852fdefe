"""The fleet: every node of every node type verified through the engines it already runs
(Slurm, Kubernetes); envbuild schedules nothing itself."""
