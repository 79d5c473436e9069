#!/bin/sh
# fabricd Slurm epilog: the job left this node; forget its record (see prolog.sh).
# A node that crashes before its epilog keeps a stale file: the agent checks every file against
# `scontrol listpids` and the running processes, and stops reporting a job that has neither.
dir="${FABRICD_JOBS_DIR:-/run/fabricd/jobs}"
job="${SLURM_JOB_ID:-${SLURM_JOBID:-}}"
case "$job" in
  ''|*[!0-9]*) logger -t fabricd-epilog "SLURM_JOB_ID is '$job', not a job id"; exit 0 ;;
esac
rm -f "$dir/$job.json" || logger -t fabricd-epilog "could not remove $dir/$job.json"
exit 0
