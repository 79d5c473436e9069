"""``fabricd_job_info`` on the central's ``/metrics``: one series per running job and node.

Jobs are an info series to join on (``* on(node) group_left(job_id, user) fabricd_job_info``),
never a label on every sample: a job label multiplies every node series by the jobs that ran
there (operators removed them for that reason, nebius/soperator#2923). Ended jobs leave the
family, so its size is the number of (job, node) pairs running now.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fabricd.server.store.protocols import JobReader

log = logging.getLogger("fabricd.server.metrics")
LABELS = ["node", "job_id", "user", "name", "scheduler", "hcas"]


class JobInfoCollector(Collector):
    def __init__(self, jobs: JobReader) -> None:
        self.jobs = jobs

    def describe(self) -> list[Metric]:
        return []  # no describe-time queries: the database may not be migrated yet at registration

    def collect(self) -> Iterator[Metric]:
        fam = GaugeMetricFamily("fabricd_job_info", "A job running on a node (value 1)", labels=LABELS)
        try:
            running = self.jobs.running()
        except Exception:  # fabricd_store_up already says when the store cannot be read
            log.exception("cannot read the jobs for /metrics")
            return
        for job in running:
            for node, hcas in sorted(job.nodes.items()):
                fam.add_metric([node, job.job_id, job.user, job.name, job.scheduler, ",".join(hcas)], 1.0)
        yield fam
