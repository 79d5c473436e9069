#!/bin/sh
# fabricd Slurm prolog: record the job this node now runs, for the fabricd agent's `jobs` collector.
#
# slurm.conf:  Prolog=/etc/fabricd/slurm/prolog.sh  Epilog=/etc/fabricd/slurm/epilog.sh
#              PrologFlags=Alloc   (run at allocation, not at the first step: salloc jobs count too)
# slurmd runs it as root with the job's SLURM_* variables (https://slurm.schedmd.com/prolog_epilog.html).
# It writes $FABRICD_JOBS_DIR/<jobid>.json (default /run/fabricd/jobs) atomically: a temporary
# file renamed into place, so the agent never reads half a file. It never fails the job: a
# prolog that exits non-zero drains the node, so every error is logged and the exit status is 0.
dir="${FABRICD_JOBS_DIR:-/run/fabricd/jobs}"
python3 - "$dir" <<'PY' || logger -t fabricd-prolog "could not record job ${SLURM_JOB_ID:-?} in $dir"
import json, os, sys

env = os.environ
job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
if not job.isdigit():
    sys.exit(f"SLURM_JOB_ID is {job!r}, not a job id")
record = {
    "version": 1,
    "scheduler": "slurm",
    "job_id": job,
    "user": env.get("SLURM_JOB_USER", ""),
    # Slurm sets SLURM_JOB_NAME only in PrologSlurmctld (and in newer slurmd prologs); empty otherwise.
    "name": env.get("SLURM_JOB_NAME", ""),
    "nodelist": env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", ""),
    # GPU indices on this node: the job's (prolog), or the step's (a TaskProlog).
    "gpus": env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS", ""),
    "partition": env.get("SLURM_JOB_PARTITION", ""),
}
folder = sys.argv[1]
os.makedirs(folder, mode=0o755, exist_ok=True)
tmp = os.path.join(folder, f".{job}.json.tmp")
with open(tmp, "w", encoding="utf-8") as f:
    json.dump(record, f, sort_keys=True)
    f.write("\n")
os.replace(tmp, os.path.join(folder, f"{job}.json"))
PY
exit 0
