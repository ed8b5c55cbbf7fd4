"""Every view of a job that gives its rows as row changes (`views.frame`: rows with `_id`, `_sign`, `_time`),
written by one call per micro-batch.

`ChangeViews(...).write(rows, batch_id)`, with `rows` the batch's row changes in the job's row layout:
- `row` views: a removed row's entry is removed, an added row's set (`views.row.row_delta`), absolute content;
- `count` views: each key's sums move by the rows' values times their sign (`views.count.count_delta`), fenced per
  key by the batch id, so a batch applied twice adds once; a windowed count view is kept like an agg view of sums;
- `log` views: the added rows that satisfy `where` are appended to the output log once per batch id
  (`views.log.LogSink`; a log is of a job whose rows are never removed);
- `agg` views: each key the batch touches is recomputed from the view's state and written whole (`views.agg.AggView`,
  its state under `<state_key>/views/<view>`; `append_only`: the job never removes a row);
- `list` views: likewise, each touched key's list and the bodies of its entries (`views.list.rows.TopList`).
`state_views` makes the agg and list views of a job that keep their own state, `DeltaViews` its row views and
count views without a window (the views written by Redis commands made from a frame of rows), each as its kind's
entry in `views.kinds` says. Every job kind writes
its views through these three (`ChangeViews` holds them all for the job kinds whose rows are row changes: `select`,
`join`; the `interval` and `asof` jobs say which of their rows count, and when): no job branches on a view's kind.
The Redis writes of the row and count views go out in one Spark job (`views.wire.forward`), each fenced by the
writer's lease epoch (`views.fence`). When `write` returns, every view has the batch; a batch written again (Spark
replays it after a crash) leaves the effect of one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from pyspark.sql import DataFrame

from spec.model import Pipeline
from views.fence import GATE_LUA, UNFENCED, Fence
from views.frame import view_rows
from views.kinds import KINDS, view_kind
from views.log import log_rows, log_sinks
from views.redis_io import is_cluster
from views.wire import forward, payload_rows

__all__ = ["ChangeViews", "DeltaViews", "state_views"]


def state_views(spark, lake, pipeline: Pipeline, job: str, state_key: str, **kw) -> list:
    """The views of `job` that keep their own state under `<state_key>/views/<view>` of `lake` and take its row
    changes by `write(rows, batch_id)`: each view kind's `state` in `views.kinds` (`views.agg.agg_views`, then
    `views.list.rows.list_views`; keyword arguments `append_only`, `redis_url`, `generation`, `fence`: theirs)."""
    return [
        v for k in KINDS.values() if k.state for v in k.state(spark, lake, pipeline, job, state_key, **kw)
    ]


# (frame, view) -> the view's changes (in its sink's layout)
Changes = Callable[[DataFrame, object], DataFrame]


class DeltaViews:
    """The views of job `job` of `pipeline` whose kind takes a batch as Redis commands (`views.kinds.Commands`: the
    row views and the count views without a window), generation `generation` in the Redis at `redis_url`, every
    write fenced by `fence`: `sinks` by view name, `counted` the views whose changes are the rows that count.

    `commands(frame, batch_id, shown=..., counted=...)` gives their Redis commands for one step from `frame`
    (`views.frame.view_rows` of the job's rows; each sink's `commands`, `views.sink.CommandSink`): a view's changes
    are its kind's reading of the rows (`shown` or `counted`), given by the job as `(frame, view) -> changes` or by
    view name (a DataFrame, or changes already collected on the driver, `views.count.CountRows`: those are applied
    at once, from the driver), else the kind's own (`Commands.changes`: `frame` holds row changes), fenced by
    `batch_id`. `send(commands)` applies them all in one Spark job; `write` is both."""

    def __init__(
        self, pipeline: Pipeline, job: str, *, redis_url: str, generation: int, fence: Fence = UNFENCED
    ):
        self.pipeline, self.job, self.url = pipeline, job, redis_url
        self.views = [v for v in pipeline.jobs[job].views if view_kind(v).commands]
        self.how = {v.name: view_kind(v).commands for v in self.views}
        self.sinks = {v.name: self.how[v.name].sink(redis_url, v, generation, fence) for v in self.views}
        self.counted = [v for v in self.views if self.how[v.name].reading == "counted"]
        self.scripts = tuple(dict.fromkeys((GATE_LUA, *(s for c in self.how.values() for s in c.scripts))))

    def __bool__(self) -> bool:
        return bool(self.sinks)

    def commands(
        self,
        frame: DataFrame,
        batch_id: int,
        *,
        shown: Changes | dict | None = None,
        counted: Changes | dict | None = None,
    ) -> list[DataFrame]:
        given = {"shown": shown, "counted": counted}
        out = []
        for v in self.views:
            how, sink = self.how[v.name], self.sinks[v.name]
            by = given[how.reading]
            if isinstance(by, dict):
                changes = by[v.name]
            else:
                changes = by(frame, v) if by else how.changes(frame, v, self.pipeline)
            if isinstance(changes, DataFrame):
                out.append(sink.commands(changes, batch_id))
            elif changes:  # collected on the driver: applied from here, now
                sink.write(changes, batch_id)
        return out

    def send(self, commands: list[DataFrame]) -> None:
        if commands:
            cmds = functools.reduce(DataFrame.unionByName, commands)
            forward(
                payload_rows(cmds, cluster=is_cluster(self.url)),
                self.url,
                what=f"{self.job} views",
                scripts=self.scripts,
            )

    def write(self, frame: DataFrame, batch_id: int, **kw) -> None:
        self.send(self.commands(frame, batch_id, **kw))


class ChangeViews:
    """The views of job `job` of `pipeline` for generation `generation`: Redis at `redis_url` (writes fenced by
    `fence`), output logs in `lake`, the views' own state under `state_key` of `lake` (see the module docstring)."""

    def __init__(
        self,
        spark,
        lake,
        pipeline: Pipeline,
        job: str,
        *,
        redis_url: str,
        generation: int,
        state_key: str,
        append_only: bool,
        fence: Fence = UNFENCED,
    ):
        self.pipeline, self.job = pipeline, job
        self.views = pipeline.jobs[job].views
        self.delta = DeltaViews(pipeline, job, redis_url=redis_url, generation=generation, fence=fence)
        self.logs = log_sinks(spark, lake, pipeline, job, generation)
        self.aggs = state_views(
            spark,
            lake,
            pipeline,
            job,
            state_key,
            append_only=append_only,
            redis_url=redis_url,
            generation=generation,
            fence=fence,
        )

    def write(self, rows: DataFrame, batch_id: int, *, watermark: int | None = None) -> dict:
        """Apply batch `batch_id`'s row changes `rows` to every view (see the module docstring); `watermark`: the
        job's after the batch, under which a windowed view's windows close (`views.window`). Returns {}."""
        frame = view_rows(rows, self.pipeline, self.job)
        self.delta.write(frame, batch_id)
        for agg in self.aggs:
            agg.write(frame, batch_id, watermark=watermark)
        by_name = {v.name: v for v in self.views}
        for name, sink in self.logs.items():
            sink.write(log_rows(frame.where("_sign > 0"), by_name[name], self.pipeline), batch_id)
        return {}
