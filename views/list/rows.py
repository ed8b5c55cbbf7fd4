"""The `list` view kind of the jobs that give row changes (`select`, `interval`, `asof`; a `join` job's lists are
`views.list.ListView`'s): per key, the first `cap` entries in the view's order, refilled from the view's other live
rows when an entry leaves.

What a key holds: the job's live rows (`views.frame`'s row changes: a row is live from the change that adds it to
the one that removes it; an interval job gives a left event once its window closed, an asof job each emitted event)
that satisfy `where` and whose key, entry (cast to string) and order are not null, grouped by the key's text. Per
key and entry, the row of its first order value (the greatest for a descending order, the least for an ascending
one; among rows of that value, the one of the greatest body); the key's list is the first `cap` of those entries by
(order, entry), both in the order's direction. An entry's body (its `fields`, `views.list.body_sql`) is the greatest
among the rows that place it in a list; an entry no list holds has none. An order that is a timestamp counts as its
epoch ms.

Redis: `views.list`'s layout, so its read side (`read_list`, `query_list`, `export_list`) reads these lists: sorted
set `mv:<v>:<g>:{<key>}` (member the entry, score the order), the entry's body at `mv:<v>.entry:<g>:{<entry>}`. A
batch writes through `views.list.ListViewSink`, in three phases, each after the one before: the bodies of the
entries its keys' lists hold after it (SET); each touched key's whole list (`mode="replace"`, one fenced call: a
reader sees the list before or after the batch); the bodies of entries that left its keys' lists and that no list
holds any more (DEL). Every write is absolute, so a replayed batch writes what its first attempt wrote.

State (`views.state`: files, protocol and replay; under the key the job gives), in one of two modes:
- `rows` (`append_only=False`: a select of a table topic): each live row of the view by `_id`, with its key `_key`,
  entry `_e`, order `_o` and body `_b`; a batch recomputes the lists of the keys it touches (a row's key after and
  before it) from their rows, so an entry that leaves is refilled from the key's other rows;
- `top` (`append_only=True`: a select of an event topic, interval, asof: rows are never removed): per key only the
  rows of its list (`_sid`: the key and the entry), since an entry that fell out of a list can never return; a
  batch merges its rows into its keys' lists.
Bounded by the live rows, and for `top` by `cap` rows per key.

A windowed view (`view.window`, `views.window`): the rows (not late) are kept per window in the `top` mode, keyed
`<key>|<window start>` with the window's columns; a merged session's rows move under the merged session's key. Each
touched key's window is written beside its list (`kind="window"` operations, in the lists' phase):
`mv:<v>.window:<g>:{<key>}` holds `{"<key name>": key, "window_start", "window_end", "final"}`, deleted with the
list when the window leaves (merged into another session, or older than `retain`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import NumericType, TimestampType

from changelog.storage import Lake
from spec.model import Pipeline, View
from views import window
from views.errors import ViewError
from views.fence import UNFENCED, Fence
from views.frame import empty_rows, select_view, view_rows
from views.list.sink import Few, ListViewSink, as_ops, body_sql, entry
from views.state import LakeState, StateStep, StateView, changed_rows, fresh, touched, views_of
from views.wire import lit

__all__ = ["TopList", "ListStep", "list_views"]

_LIVE = "_sign > 0 AND _where AND _key IS NOT NULL AND _e IS NOT NULL AND _o IS NOT NULL"
_PAYLOAD = ["_e", "_o", "_b"]
_SID = "to_json(array(_key, _e))"  # a `top` state row's identity: its key and entry


@dataclass
class ListStep(StateStep):
    """One micro-batch's work (`views.state.StateStep`) and its Redis operations (`ops`: `views.list`'s
    LIST_OPS_SCHEMA and `_phase`, the write phase of the module docstring each belongs to: 0, 1 or 2)."""

    ops: DataFrame | None = None


def _order_sql(view: View, frame: DataFrame, pipeline: Pipeline) -> tuple[str, str]:
    """(SQL of the order value over `select_view`'s `_order0`, its SQL type): a number as it is, a timestamp as
    its epoch ms. Raises `ViewError` for an order of another type."""
    kind = select_view(frame, view, pipeline, parts=("order",)).schema["_order0"].dataType
    if isinstance(kind, TimestampType):
        return "unix_millis(_order0)", "bigint"
    if isinstance(kind, NumericType):
        return "_order0", kind.simpleString()
    raise ViewError(
        f"view {view.name!r}: its order {view.order[0][0]!r} is a {kind.simpleString()}, not a number or a "
        "timestamp"
    )


class TopList(StateView):
    """List view `view` of `pipeline` (a job that gives row changes): its state under key `key` of lake `lake`
    (`append_only`: the job never removes a row, so the `top` mode), its lists and bodies in generation
    `generation` of the Redis at `redis_url`, each write fenced by `fence` (see the module docstring). A
    `views.sink.Sink`: `write(changes, batch_id)` returns `{"lists": n, "entries": m}` (lists written, entries
    they hold).

    `snapshot_every`: batch directories between two compactions."""

    def __init__(
        self,
        spark,
        lake: Lake,
        view: View,
        pipeline: Pipeline,
        key: str,
        *,
        append_only: bool,
        redis_url: str,
        generation: int,
        fence: Fence = UNFENCED,
        snapshot_every: int = 100,
    ):
        if view.kind != "list":
            raise ViewError(f"view {view.name!r} is a {view.kind} view, not a list")
        self.view, self.pipeline, self.append_only = view, pipeline, append_only
        self.descending, self.cap = view.order[0][1], view.cap
        empty = view_rows(empty_rows(spark, pipeline, view.job), pipeline, view.job)
        self.order, order_type = _order_sql(view, empty, pipeline)
        self.body = body_sql(view)
        self.sink = ListViewSink(
            redis_url, view.name, generation, view.cap, descending=self.descending, fence=fence
        )
        self.window = view.window
        if self.window is not None and not append_only:
            raise ViewError(f"view {view.name!r}: a window is of a job whose rows are never removed")
        payload = [("_e", "string"), ("_o", order_type), ("_b", "string")]
        if self.window is not None:
            payload = [*window.COLUMNS, *payload]
        self.payload = [n for n, _ in payload]
        mode = "windows" if self.window is not None else "top" if append_only else "rows"
        root = f"{key.strip('/')}/{mode}".lstrip("/")
        self.store = LakeState(spark, lake, root, payload, snapshot_every=snapshot_every)

    def _inputs(self, frame: DataFrame) -> DataFrame:
        """`frame` (row changes, `views.frame.view_rows`) as `_id`, `_sign` (those it has), `_key`, `_where`, `_e`,
        `_o` and `_b`."""
        sel = select_view(
            frame, self.view, self.pipeline, parts=("key", "where", "entry", "order"), keep=frame.columns
        )
        keep = [c for c in ("_id", "_sign", "_time", "_late") if c in sel.columns]
        return sel.selectExpr(
            *keep,
            "_key",
            "_where",
            "CAST(_entry AS string) AS _e",
            f"{self.order} AS _o",
            f"{self.body} AS _b",
        )

    def _ranked(self, rows: DataFrame) -> DataFrame:
        """The lists of the keys of `rows` (`_key`, `_e`, `_o`, `_b`, ...): per key and entry its row of the first
        order value (of the greatest body among those), then per key the first `cap` entries by (order, entry)."""
        o = F.col("_o").desc() if self.descending else F.col("_o").asc()
        e = F.col("_e").desc() if self.descending else F.col("_e").asc()
        one = Window.partitionBy("_key", "_e").orderBy(o, F.col("_b").desc())
        # one shuffle by key serves both windows (Spark would shuffle by (key, entry), then by key again)
        best = rows.repartition("_key").withColumn("_r", F.row_number().over(one)).where("_r = 1")
        per_key = Window.partitionBy("_key").orderBy(o, e)
        top = best.withColumn("_r", F.row_number().over(per_key)).where(F.col("_r") <= self.cap)
        return top.drop("_r")

    def _merged(self, state: DataFrame, ev: DataFrame) -> DataFrame:
        """`top` mode: the batch's state rows (`b<N>`): the lists of the keys the batch adds rows to, their rows
        before merged with the batch's, and the rows that fell out of them (`_gone`)."""
        new = ev.where(_LIVE).select("_key", *_PAYLOAD)
        keys = new.select("_key").distinct()
        old = state.join(F.broadcast(keys), "_key", "left_semi")
        top = self._ranked(old.select("_key", *_PAYLOAD).unionByName(new)).withColumn("_sid", F.expr(_SID))
        kept = top.selectExpr("_sid", "false AS _gone", "CAST(NULL AS string) AS _was", "_key", *_PAYLOAD)
        dropped = old.join(top.select("_sid"), "_sid", "left_anti").selectExpr(
            "_sid", "true AS _gone", "_key AS _was", "CAST(NULL AS string) AS _key", *_PAYLOAD
        )
        return kept.unionByName(dropped)

    def _merged_windows(self, state: DataFrame, ev: DataFrame) -> DataFrame:
        """Windowed `top` mode: the batch's rows (not late) in each of their windows merged into its list; a session
        merged into another gives its rows to the merged one (under its key: the old rows leave, `_gone`)."""
        rows = window.not_late(ev.where(_LIVE)).select("_key", "_time", *_PAYLOAD)
        spans = window.in_windows(rows, self.window).select("_k0", "_ws", "_we", "_key", *_PAYLOAD)
        if self.window.kind == "session":
            k0s = spans.select("_k0").distinct()
            old = state.where("NOT _fin").join(F.broadcast(k0s), "_k0", "left_semi")
            both = old.select("_k0", "_ws", "_we", *_PAYLOAD).unionByName(spans.drop("_key"))
            merged = window.sessions_of(both)
        else:
            keys = spans.select("_key").distinct()
            old = state.join(F.broadcast(keys), "_key", "left_semi")
            merged = old.select("_k0", "_ws", "_we", "_key", *_PAYLOAD).unionByName(spans)
        top = self._ranked(merged).withColumn("_sid", F.expr(_SID)).withColumn("_fin", F.lit(False))
        kept = top.selectExpr("_sid", "false AS _gone", "CAST(NULL AS string) AS _was", "_key", *self.payload)
        dropped = old.join(top.select("_sid"), "_sid", "left_anti").selectExpr(
            "_sid", "true AS _gone", "_key AS _was", "CAST(NULL AS string) AS _key", *self.payload
        )
        return kept.unionByName(dropped)

    def _window_ops(self, after: DataFrame, keys: DataFrame) -> DataFrame:
        """Each touched key's window (`kind="window"`: its JSON, null for a key whose window left), phase 1."""
        per_key = after.join(keys, "_key", "left_semi").groupBy("_key").agg(
            F.first("_k0").alias("_k0"), F.first("_ws").alias("_ws"), F.first("_we").alias("_we"),
            F.max("_fin").alias("_fin"),
        )  # fmt: skip
        pairs = f"{lit(self.view.key_name)}, _k0, 'window_start', _ws, 'window_end', _we, 'final', _fin"
        body = f"CASE WHEN _k0 IS NOT NULL THEN to_json(named_struct({pairs})) END"
        ops = as_ops(keys.join(per_key, "_key", "left"), "window", "_key", body=body)
        return ops.withColumn("_phase", F.lit(1))

    def _ops(self, before: DataFrame, after: DataFrame, keys: DataFrame) -> DataFrame:
        """The operations (LIST_OPS_SCHEMA) of a batch that touches `keys` (`_key`), from the state `before` and
        `after` it, each with its write phase (`_phase`): 0 the bodies to set, 1 each key's whole list, 2 the bodies
        to delete (of the entries its keys' lists held before or hold after: set when some list holds the entry after
        the batch, else deleted)."""
        keys = F.broadcast(keys)
        # `top` mode: a key's rows in the state are its list, ranked already
        ranked = (lambda rows: rows) if self.append_only else self._ranked
        old = ranked(before.join(keys, "_key", "left_semi"))
        new = ranked(after.join(keys, "_key", "left_semi"))
        per_key = new.selectExpr("_key", f"{entry('_o', '_e')} AS _p").groupBy("_key")
        lists = keys.join(per_key.agg(F.collect_list("_p").alias("_ps")), "_key", "left")
        lists = as_ops(lists, "list", "_key", "'replace'", entries="coalesce(_ps, array())")
        cand = fresh(old.select("_e").union(new.select("_e")).distinct())
        held = after.join(F.broadcast(cand), "_e", "left_semi")  # the rows of the candidates
        if not self.append_only:  # those in their key's list
            holders = fresh(held.select("_key").distinct())
            held = self._ranked(after.join(holders, "_key", "left_semi")).join(
                F.broadcast(cand), "_e", "left_semi"
            )
        bodies = cand.join(held.groupBy("_e").agg(F.max("_b").alias("_b")), "_e", "left")
        bodies = as_ops(bodies, "entry", "_e", body="_b").withColumn(
            "_phase", F.expr("IF(body IS NULL, 2, 0)")
        )
        ops = bodies.unionByName(lists.withColumn("_phase", F.lit(1)))
        return ops if self.window is None else ops.unionByName(self._window_ops(after, keys))

    def step(self, changes: DataFrame, batch_id: int, *, watermark: int | None = None) -> ListStep:
        """Batch `batch_id`'s state rows, the state after it and its Redis operations (`ListStep`), from `changes`
        (the batch's row changes, `views.frame.view_rows`) and the state before it; when an earlier attempt of the
        batch staged `b<batch_id>` whole, from that instead (`views.state`). Materializes the state rows and the
        state after; the operations are computed when `publish` reads them."""
        state, log = self.store.before(batch_id)
        staged = log is not None
        if not staged:
            ev = self._inputs(changes)
            if self.window is not None:
                log = window.settle(state, self._merged_windows(state, ev), watermark, self.view.retain_ms)
            elif self.append_only:
                log = self._merged(state, ev)
            else:
                log = changed_rows(state, ev, _LIVE, _PAYLOAD)
            log = log.localCheckpoint(eager=True)
        after = self.store.after(state, log)
        return ListStep(batch_id, log, staged, state, after, self._ops(state, after, touched(log)))

    def publish(self, step: ListStep) -> dict:
        """Write the batch's operations, phase after phase (`views.list.ListViewSink.write` of a phase of `Few`: from
        the driver when at most `ListViewSink.DRIVER_ROWS` operations, else from the executors). Returns `{"lists":
        n, "entries": m}`."""
        return self.sink.write((step.ops, Few(3)), step.batch_id)


def list_views(spark, lake: Lake, pipeline: Pipeline, job: str, state_key: str, **kw) -> list[TopList]:
    """A `TopList` for each list view of `job` (none for a `join` job, whose lists are `views.list.ListView`'s), its
    state under `<state_key>/views/<view>` of `lake` (keyword arguments `append_only`, `redis_url`, `generation`,
    `fence`: `TopList`'s)."""
    if pipeline.jobs[job].kind == "join":
        return []
    return views_of(TopList, "list", spark, lake, pipeline, job, state_key, **kw)
