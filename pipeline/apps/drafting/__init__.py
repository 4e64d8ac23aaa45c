"""`pexec spec draft`: a spec to review, mined from a night of logs (docs/how-to/score-logs-without-a-spec.md).

evidence.py   what a shard's rollouts show, as small sums merged across shards
proposal.py   from evidence to the draft's files: definitions, grounded parameters, candidate rules
run.py        the logs read as `score` reads them (OTel spans shuffled as it shuffles them), in Ray tasks or inline;
              the draft folder written

Imports: core, ingest, replay, storage, scoring.
"""

from pipeline.apps.drafting.evidence import Evidence, observe
from pipeline.apps.drafting.proposal import DraftSettings
from pipeline.apps.drafting.run import Draft, draft

__all__ = ["Draft", "DraftSettings", "Evidence", "draft", "observe"]
