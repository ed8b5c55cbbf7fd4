"""`spec.load`: a pipeline file loads into the model, or every problem is one line with file, line and key.

The table of broken pipelines doubles as the reference of `mview check`'s messages: each case is a small pipeline
with one mistake, the line it is on, the key path and a piece of the message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spec import PipelineError
from views.pipeline import load_pipeline, parse_pipeline

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = ROOT / "timeline_demo" / "pipelines" / "builtin.yml"

# Two event topics and two table topics that the broken pipelines below refer to (lines 1-9).
BASE = """\
topics:
  orders:
    fields: {order_id: id, customer_id: id, amount: double, ts: timestamp}
    id: order_id
    time: ts
  payments: {fields: {payment_id: id, order_id: id, ts: timestamp}, id: payment_id, time: ts}
  customers: {fields: {customer_id: id, tier: string, ts: timestamp}, key: customer_id, time: ts, op: {upsert: upsert, remove: delete}}
  open_orders: {fields: {order_id: id, customer_id: id, ts: timestamp}, key: order_id, time: ts}
"""


def _job(body: str) -> str:
    return BASE + "jobs:\n" + body


PAID = "  paid:\n    interval: {left: orders, right: payments, match: {order_id: order_id}, within: [0 s, 30 min]}\n"

# (case, text, line, key, a piece of the message)
BROKEN = [
    *[
        (f"from: {case}", BASE + f"  t: {body}\n", 9, key, says)
        for case, body, key, says in [
            ("no such topic", "{from: nope, key: order_id}", "topics.t.from", "'nope' is not a topic"),
            ("a table topic", "{from: customers, key: customer_id}", "topics.t.from", "is a table topic"),
            (
                "fields of its own",
                "{from: orders, key: order_id, time: ts}",
                "topics.t.time",
                "give only `key`",
            ),
            ("no key", "{from: orders}", "topics.t", "give its `key`"),
            ("an unknown view", "{from: {view: v}}", "topics.t.from.view", "unknown view 'v'"),
            ("no fields at all", "{key: order_id}", "topics.t", "needs `fields`"),
        ]
    ],
    (
        "from: a topic read from another",
        BASE + "  t: {from: orders, key: order_id}\n  u: {from: t, key: order_id}\n",
        10,
        "topics.u.from",
        "read 'orders'",
    ),
    (
        "unknown field type",
        BASE.replace("amount: double", "amount: money"),
        3,
        "topics.orders.fields.amount",
        "'money'",
    ),
    (
        "id and key",
        BASE.replace("id: order_id\n", "id: order_id\n    key: order_id\n"),
        2,
        "topics.orders",
        "not both",
    ),
    (
        "unknown id field",
        BASE.replace("id: order_id\n", "id: order_no\n"),
        4,
        "topics.orders.id",
        "'order_no'",
    ),
    (
        "time not a timestamp",
        BASE.replace("amount: double, ts: timestamp", "amount: double, ts: long"),
        5,
        "topics.orders.time",
        "timestamp",
    ),
    (
        "op on an event topic",
        BASE.replace("    time: ts\n", "    time: ts\n    op: {upsert: a, remove: b}\n", 1),
        6,
        "topics.orders.op",
        "table topics",
    ),
    (
        "unknown key of a topic",
        BASE.replace("    time: ts\n", "    time: ts\n    primary: order_id\n", 1),
        6,
        "topics.orders.primary",
        "unknown key",
    ),
    (
        "on: instead of match:",
        _job(
            "  j:\n    join: {left: open_orders, right: customers, on: {customer_id: customer_id}}\n    views: {v: {row: {k: order_id}}}\n"
        ),
        11,
        "jobs.j.join.on",
        "match:",
    ),
    (
        "join of two event topics",
        _job(
            "  j:\n    join: {left: orders, right: payments, match: {order_id: order_id}}\n    views: {v: {row: {k: order_id}}}\n"
        ),
        11,
        "jobs.j.join.left",
        "event topic",
    ),
    (
        "unknown topic",
        _job(
            "  j:\n    asof: {stream: orders, table: customer, match: {customer_id: customer_id}}\n    views: {v: {log: {fields: {a: order_id}}}}\n"
        ),
        11,
        "jobs.j.asof.table",
        "unknown topic 'customer'",
    ),
    (
        "bad duration",
        _job(PAID.replace("30 min", "30 minutez") + "    views: {v: {row: {k: order_id}}}\n"),
        11,
        "jobs.j.interval.within.1".replace("j.", "paid."),
        "cannot parse duration",
    ),
    (
        "empty interval",
        _job(PAID.replace("[0 s, 30 min]", "[1 h, 30 min]") + "    views: {v: {row: {k: order_id}}}\n"),
        11,
        "jobs.paid.interval.within",
        "after the upper",
    ),
    (
        "unknown field in a view",
        _job(PAID + "    views: {v: {row: {k: order_idd}}}\n"),
        12,
        "jobs.paid.views.v.row.k",
        "'order_idd'",
    ),
    (
        "a list without order",
        _job(
            "  j:\n    join: {left: open_orders, right: customers, match: {customer_id: customer_id}}\n    views: {v: {list: {c: customer_id}, entry: order_id, cap: 5}}\n"
        ),
        12,
        "jobs.j.views.v.order",
        "needs `order`",
    ),
    (
        "a list without cap",
        _job(
            "  j:\n    join: {left: open_orders, right: customers, match: {customer_id: customer_id}}\n    views: {v: {list: {c: customer_id}, entry: order_id, order: ts desc}}\n"
        ),
        12,
        "jobs.j.views.v.cap",
        "needs `cap`",
    ),
    (
        "a fan-out limit on a list of an interval job",
        _job(
            PAID
            + "    views: {v: {list: {c: customer_id}, entry: order_id, order: ts desc, cap: 3, fanout_limit: 5}}\n"
        ),
        12,
        "jobs.paid.views.v.fanout_limit",
        "is for a list view of a join job",
    ),
    (
        "a log of a join job",
        _job(
            "  j:\n    join: {left: open_orders, right: customers, match: {customer_id: customer_id}}\n    views: {v: {log: {fields: {a: order_id}}}}\n"
        ),
        12,
        "jobs.j.views.v.log",
        "asof and select jobs",
    ),
    (
        "a log of a select of a table",
        _job("  j:\n    select: {from: customers}\n    views: {v: {log: {fields: {a: tier}}}}\n"),
        12,
        "jobs.j.views.v.log",
        "of an event topic",
    ),
    (
        "a list ordered by a string",
        _job(
            "  j:\n    join: {left: open_orders, right: customers, match: {customer_id: customer_id}}\n"
            "    views: {v: {list: {c: customer_id}, entry: order_id, order: tier desc, cap: 3}}\n"
        ),
        12,
        "jobs.j.views.v.order.0",
        "a number or a timestamp; 'tier' is a string",
    ),
    (
        "a select of an unknown topic",
        _job("  j:\n    select: {from: nowhere}\n    views: {v: {row: {a: tier}}}\n"),
        11,
        "jobs.j.select.from",
        "unknown topic 'nowhere'",
    ),
    (
        "an aggregate that is not one",
        _job(
            "  j:\n    select: {from: customers}\n    views: {v: {agg: {t: tier}, values: {n: median(ts)}}}\n"
        ),
        12,
        "jobs.j.views.v.values.n",
        "count(distinct EXPR)",
    ),
    (
        "an agg view without values",
        _job("  j:\n    select: {from: customers}\n    views: {v: {agg: {t: tier}}}\n"),
        12,
        "jobs.j.views.v.values",
        "needs `values`",
    ),
    (
        "an aggregate of a field the rows lack",
        _job(
            "  j:\n    select: {from: customers}\n    views: {v: {agg: {t: tier}, values: {n: max(nope)}}}\n"
        ),
        12,
        "jobs.j.views.v.values.n",
        "'nope' is not a field of customers",
    ),
    (
        "a count without values",
        _job(PAID + "    views: {v: {count: {k: order_id}}}\n"),
        12,
        "jobs.paid.views.v.values",
        "needs `values`",
    ),
    (
        "a view of two kinds",
        _job(PAID + "    views: {v: {row: {k: order_id}, count: {k: order_id}, values: {n: 1}}}\n"),
        12,
        "jobs.paid.views.v",
        "exactly one of",
    ),
    (
        "asof match not the table key",
        _job(
            "  j:\n    asof: {stream: orders, table: customers, match: {amount: tier}}\n    views: {v: {log: {fields: {a: order_id}}}}\n"
        ),
        11,
        "jobs.j.asof.match",
        "exactly the key",
    ),
    (
        "a pin that is no field",
        _job(
            "  j:\n    asof: {stream: orders, table: customers, match: {customer_id: customer_id}, pin: customer_version}\n    views: {v: {log: {fields: {a: order_id}}}}\n"
        ),
        11,
        "jobs.j.asof.pin",
        "'customer_version'",
    ),
    ("a job without views", _job(PAID), 10, "jobs.paid.views", "at least one view"),
    (
        "a job named like a source job",
        _job(PAID.replace("paid:", "kafka:") + "    views: {v: {row: {k: order_id}}}\n"),
        10,
        "jobs.kafka",
        "source job",
    ),
    (
        "a view name taken",
        _job(
            PAID
            + "    views: {v: {row: {k: order_id}}}\n"
            + PAID.replace("paid:", "paid2:")
            + "    views: {v: {row: {k: order_id}}}\n"
        ),
        15,
        "jobs.paid2.views.v",
        "taken by job 'paid'",
    ),
    (
        "list order second term not the entry",
        _job(
            "  j:\n    join: {left: open_orders, right: customers, match: {customer_id: customer_id}}\n    views: {v: {list: {c: customer_id}, entry: order_id, order: [ts desc, tier desc], cap: 3}}\n"
        ),
        12,
        "jobs.j.views.v.order.1",
        "the entry",
    ),
    (
        "a key of another view kind",
        _job(PAID + "    views: {v: {row: {k: order_id}, cap: 3}}\n"),
        12,
        "jobs.paid.views.v.cap",
        "not a key of a row view",
    ),
    (
        "the right side in an interval view",
        _job(PAID + "    views: {v: {row: {k: payments.payment_id}}}\n"),
        12,
        "jobs.paid.views.v.row.k",
        "not a topic whose fields",
    ),
    (
        "a topic named like a field",
        _job(
            "  j:\n    join: {left: open_orders, right: customers, match: {customer_id: customer_id}}\n    views: {v: {row: {k: order_id}}}\n"
        )
        .replace("open_orders", "tier")
        .replace(
            "customers: {fields: {customer_id: id, tier: string",
            "customers: {fields: {customer_id: id, tier: string",
        ),
        11,
        "jobs.j.join",
        "name of a field",
    ),
    *[
        (
            f"window: {case}",
            _job(f"  s:\n    select: {{from: {topic}}}\n    views:\n      v:\n        {view}\n{extra}"),
            16,
            key,
            says,
        )
        for case, topic, view, extra, key, says in [
            (
                "on a join's rows",
                "open_orders",
                "count: {k: order_id}",
                "        values: {n: 1}\n        window: {tumble: 1 h}\n",
                "jobs.s.views.v.window",
                "no event time",
            ),
            (
                "hop without every",
                "orders",
                "agg: {k: order_id}",
                "        values: {n: count(*)}\n        window: {hop: 1 h}\n",
                "jobs.s.views.v.window",
                "needs `every`",
            ),
            (
                "every beyond the size",
                "orders",
                "agg: {k: order_id}",
                "        values: {n: count(*)}\n        window: {hop: 1 h, every: 2 h}\n",
                "jobs.s.views.v.window.every",
                "longer than the window",
            ),
            (
                "two kinds",
                "orders",
                "agg: {k: order_id}",
                "        values: {n: count(*)}\n        window: {tumble: 1 h, session: 1 min}\n",
                "jobs.s.views.v.window",
                "one of",
            ),
            (
                "a duration without a unit",
                "orders",
                "agg: {k: order_id}",
                "        values: {n: count(*)}\n        window: {session: 5}\n",
                "jobs.s.views.v.window.session",
                "cannot parse duration",
            ),
            (
                "zero",
                "orders",
                "agg: {k: order_id}",
                "        values: {n: count(*)}\n        window: {tumble: 0 s}\n",
                "jobs.s.views.v.window.tumble",
                "above 0",
            ),
            (
                "on a row view",
                "orders",
                "row: {k: order_id}",
                "        fields: {a: amount}\n        window: {tumble: 1 h}\n",
                "jobs.s.views.v.window",
                "not a key of a row view",
            ),
        ]
    ],
    (
        "retain without a window",
        _job(
            "  s:\n    select: {from: orders}\n    views:\n      v:\n        agg: {k: order_id}\n        values: {n: count(*)}\n        retain: 1 d\n"
        ),
        16,
        "jobs.s.views.v.retain",
        "add a `window`",
    ),
    ("not YAML", "topics: [\n", 2, "", "not valid YAML"),
    ("no topics", "jobs: {}\n", 1, "topics", "missing"),
]


@pytest.mark.parametrize(("case", "text", "line", "key", "says"), BROKEN, ids=[c[0] for c in BROKEN])
def test_a_broken_pipeline_is_one_line_with_file_line_and_key(case, text, line, key, says):
    with pytest.raises(PipelineError) as caught:
        parse_pipeline(text, "shop.yml", {})
    lines = str(caught.value).splitlines()
    expected = f"shop.yml:{line}: {key}: " if key else f"shop.yml:{line}: "
    assert any(got.startswith(expected) and says in got for got in lines), lines
    assert all(got.startswith("shop.yml:") for got in lines)


def test_every_problem_is_reported_not_only_the_first():
    text = (
        BASE.replace("amount: double", "amount: money")
        + "jobs:\n"
        + PAID
        + "    views: {v: {count: {k: nope}}}\n"
    )
    with pytest.raises(PipelineError) as caught:
        parse_pipeline(text, "shop.yml", {})
    assert len(caught.value.problems) >= 2, caught.value.problems


def test_the_built_in_pipeline_loads_with_the_contract_s_topics_jobs_and_views():
    p = load_pipeline(BUILTIN, {})
    assert list(p.topics) == ["tweets", "follows", "searches", "clicks", "activity", "profiles"]
    assert {j: [v.name for v in job.views] for j, job in p.jobs.items()} == {
        "timeline": ["timeline"],
        "clicks": ["search_clicks", "ctr"],
        "enrichment": ["enriched_activity", "activity_by_country"],
    }
    assert p.views["timeline"].cap == 800 and p.views["timeline"].fanout_limit is None
    assert p.topics["profiles"].capture.postgres == "profiles"


def test_a_topic_read_from_an_event_topic_is_a_table_of_its_log():
    p = parse_pipeline(BASE + "  order_table: {from: orders, key: order_id}\n", "shop.yml", {})
    t, src = p.topics["order_table"], p.topics["orders"]
    assert (t.kind, t.key, t.source) == ("table", ("order_id",), "orders")
    assert (t.fields, t.time, t.optional, t.op) == (src.fields, src.time, src.optional, None)


def test_settings_reach_the_file_through_the_environment():
    p = load_pipeline(BUILTIN, {"TIMELINE_CAP": "50", "FANOUT_LIMIT": "7", "PG_TABLE": "people"})
    assert (p.views["timeline"].cap, p.views["timeline"].fanout_limit) == (50, 7)
    assert p.topics["profiles"].capture.postgres == "people"


def test_a_fingerprint_changes_with_the_definition_and_only_for_the_jobs_it_touches():
    before = load_pipeline(BUILTIN, {})
    after = load_pipeline(BUILTIN, {"TIMELINE_CAP": "50"})
    assert before.fingerprint("timeline") != after.fingerprint("timeline")
    assert before.fingerprint("clicks") == after.fingerprint("clicks")
    assert load_pipeline(BUILTIN, {"PG_TABLE": "people"}).fingerprint("enrichment") == before.fingerprint(
        "enrichment"
    )


def test_an_unreadable_file_is_one_problem(tmp_path):
    with pytest.raises(PipelineError) as caught:
        load_pipeline(tmp_path / "missing.yml", {})
    assert "cannot read the pipeline file" in str(caught.value)


def _alias_bomb(levels: int = 9) -> str:
    """A small file whose aliases expand to 9**levels values (a "billion laughs")."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return "\n".join(lines) + f"\ntopics: *a{levels - 1}\n"


@pytest.mark.parametrize(
    ("case", "text", "says"),
    [
        ("alias bomb", _alias_bomb(), "aliases"),
        ("deep nesting", "topics: " + "[" * 5000 + "]" * 5000 + "\n", "nested"),
        ("an alias inside itself", "topics: &x [*x]\n", "itself"),
    ],
    ids=lambda c: c if isinstance(c, str) and len(c) < 30 else "",
)
def test_a_hostile_file_is_one_line_at_once(case, text, says):
    import time

    started = time.monotonic()
    with pytest.raises(PipelineError) as caught:
        parse_pipeline(text, "bomb.yml", {})
    assert time.monotonic() - started < 2
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("bomb.yml:") and says in lines[0], lines


def test_aliases_within_bounds_still_load():
    text = BASE.replace("  payments: {", "  payments: &p {") + "  payments2: *p\n"
    assert list(parse_pipeline(text, "shop.yml", {}).topics)[-1] == "payments2"


@pytest.mark.parametrize(
    "job",
    [
        PAID,
        "  enriched:\n    asof: {stream: orders, table: customers, match: {customer_id: customer_id}}\n",
        "  sel:\n    select: {from: orders}\n",
        "  sel:\n    select: {from: open_orders}\n",
        "  j:\n    join: {left: open_orders, right: customers, match: {customer_id: customer_id}}\n",
    ],
    ids=["interval", "asof", "select of events", "select of a table", "join"],
)
def test_a_list_view_is_accepted_on_every_job_kind(job):
    text = _job(job + "    views: {v: {list: {c: customer_id}, entry: order_id, order: ts desc, cap: 3}}\n")
    view = parse_pipeline(text, "shop.yml", {}).views["v"]
    assert (view.kind, view.cap, view.order, view.fanout_limit) == ("list", 3, (("ts", True),), None)


_ROW_VIEW = "    views: {v: {row: {k: order_id}, fields: {x: X}}}\n"


@pytest.mark.parametrize(
    "expr",
    [
        "\"reflect('java.lang.System', 'getenv', 'AWS_SECRET_ACCESS_KEY')\"",
        "\"JAVA_METHOD('java.lang.System', 'getenv', 'HOME')\"",
        "\"concat(order_id, try_reflect('java.lang.System', 'getenv', 'HOME'))\"",
        "\"`reflect`('java.lang.System', 'getenv', 'HOME')\"",
        "\"reflect /* a comment */ ('java.lang.System', 'getenv', 'HOME')\"",
        "\"concat('it''s', reflect('java.lang.System', 'getenv', 'HOME'))\"",
        "\"concat(r'\\\\', reflect('java.lang.System', 'getenv', 'HOME'))\"",  # a raw string: its backslash escapes nothing
        '"(SELECT max(value) FROM text.`/etc/hostname`)"',
    ],
)
def test_an_expression_that_calls_java_or_reads_a_table_is_refused(expr):
    text = _job(PAID + _ROW_VIEW.replace("X", expr))
    with pytest.raises(PipelineError) as caught:
        parse_pipeline(text, "shop.yml", {})
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("shop.yml:12: jobs.paid.views.v.fields.x: "), lines


def test_java_function_names_in_a_string_or_as_a_field_are_fine():
    for expr in ("\"concat('reflect(', order_id)\"", "\"'select me'\"", "order_id"):
        parse_pipeline(_job(PAID + _ROW_VIEW.replace("X", expr)), "shop.yml", {})


def test_reflection_is_refused_in_where_and_match_too():
    where = PAID + "    views: {v: {row: {k: order_id}, where: \"java_method('a', 'b') = 'x'\"}}\n"
    match = PAID.replace("{order_id: order_id}", "{\"reflect('a', 'b')\": order_id}") + _ROW_VIEW.replace(
        "X", "order_id"
    )
    for body, key in ((where, "jobs.paid.views.v.where"), (match, "jobs.paid.interval.match")):
        with pytest.raises(PipelineError) as caught:
            parse_pipeline(_job(body), "shop.yml", {})
        assert key in str(caught.value) and "Java" in str(caught.value)


def test_a_broken_topic_is_said_once_not_again_for_every_job_that_uses_it():
    text = _job(PAID + _ROW_VIEW.replace("X", "order_id")).replace("amount: double", "amount: money")
    with pytest.raises(PipelineError) as caught:
        parse_pipeline(text, "shop.yml", {})
    assert [p.key for p in caught.value.problems] == ["topics.orders.fields.amount"], str(caught.value)


@pytest.mark.parametrize(
    ("old", "new", "key", "says"),
    [
        ("cap: 5", "cap: five", "cap", "a whole number, not 'five'"),
        ("cap: 5", "cap: 2.5", "cap", "a whole number, not 2.5"),
        ("unmatched: false", "unmatched: maybe", "unmatched", "true or false, not 'maybe'"),
        ("entry: order_id", "entry: [order_id]", "entry", "an expression"),
    ],
)
def test_a_value_of_the_wrong_kind_is_said_in_words(old, new, key, says):
    body = (
        PAID.replace("]}", "], unmatched: false}")
        + "    views: {v: {list: {k: customer_id}, entry: order_id, order: [ts desc], cap: 5}}\n"
    )
    with pytest.raises(PipelineError) as caught:
        parse_pipeline(_job(body).replace(old, new), "shop.yml", {})
    message = str(caught.value)
    assert key in message and says in message and "Input should" not in message, message


@pytest.mark.parametrize(
    "name",
    ["AWS_SECRET_ACCESS_KEY", "PG_DSN", "REDIS_URL", "db_password", "API_TOKEN", "PASS", "MY_PRIVATE_KEY"],
)
def test_a_variable_that_may_hold_a_credential_is_refused_with_its_line(name):
    text = _job(PAID + _ROW_VIEW.replace("X", f"\"concat('${{{name}}}', order_id)\""))
    with pytest.raises(PipelineError) as caught:
        parse_pipeline(text, "shop.yml", {name: "s3cr3t-value"})
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("shop.yml:12: ") and name in lines[0], lines
    assert "s3cr3t-value" not in str(caught.value)


@pytest.mark.parametrize("name", ["TIMELINE_CAP", "PG_TABLE", "KEYSPACE_TIER", "PASSAGE_CITY"])
def test_other_variables_are_read(name):
    text = _job(PAID + _ROW_VIEW.replace("X", f"\"concat('${{{name}}}', order_id)\""))
    pipeline = parse_pipeline(text, "shop.yml", {name: "v1"})
    assert dict(pipeline.views["v"].fields)["x"] == "concat('v1', order_id)"


# --- Chained jobs: topics read from a view (`from: {view: ...}`) ---

CHAIN = (
    BASE
    + """\
  totals: {from: {view: by_customer}}
  tiers: {from: {view: tier_of}}
  paid_log: {from: {view: paid_orders}, id: order_id, time: ts}
jobs:
  rich:
    join: {left: totals, right: tiers, match: {customer_id: customer_id}}
    views:
      by_tier: {agg: {tier: tier}, values: {customers: count(*), spent: sum(total)}}
  sums:
    select: {from: orders}
    views:
      by_customer: {agg: {customer_id: customer_id}, values: {n: count(*), total: sum(amount), top: max(amount)}}
      paid_orders: {log: {fields: {order_id: order_id, amount: amount, ts: ts}}}
  tiers_job:
    select: {from: customers}
    views:
      tier_of: {row: {customer_id: customer_id}, fields: {tier: tier}}
  again:
    select: {from: paid_log}
    views:
      big: {count: {order_id: order_id}, values: {n: "if(amount > 10, 1, 0)"}}
"""
)


def test_a_view_read_as_a_topic_has_the_view_s_key_fields_and_batches():
    p = parse_pipeline(CHAIN, "chain.yml", {})
    totals = p.topics["totals"]
    assert (totals.kind, totals.key, totals.view, totals.time, totals.op) == (
        "table", ("customer_id",), "by_customer", "_batch", ("upsert", "remove")
    )  # fmt: skip
    assert totals.fields == (
        ("customer_id", "string"), ("n", "long"), ("total", "double"), ("top", "double"), ("_batch", "timestamp")
    )  # fmt: skip
    paid = p.topics["paid_log"]
    assert (paid.kind, paid.id, paid.time, paid.fields) == (
        "event", ("order_id",), "ts", (("order_id", "string"), ("amount", "double"), ("ts", "timestamp"))
    )  # fmt: skip
    assert set(p.written) == {
        "orders",
        "payments",
        "customers",
        "open_orders",
    }  # nothing writes a view's topic
    assert list(p.jobs) == ["rich", "sums", "tiers_job", "again"]  # as the file declares them


def test_a_job_depends_on_the_jobs_of_the_views_it_reads_and_its_definition_holds_theirs():
    p = parse_pipeline(CHAIN, "chain.yml", {})
    assert p.upstream("rich") == ("sums", "tiers_job") and p.upstream("sums") == ()
    assert p.chain("rich") == ("sums", "tiers_job") and p.chain("again") == ("sums",)
    assert p.downstream("sums") == ("rich", "again") and p.downstream("tiers_job") == ("rich",)
    assert p.downstream("rich") == ()
    assert p.definition("rich")["upstream"] == {
        "sums": p.definition("sums"),
        "tiers_job": p.definition("tiers_job"),
    }
    assert "upstream" not in p.definition("sums")
    changed = parse_pipeline(CHAIN.replace("top: max(amount)", "top: min(amount)"), "chain.yml", {})
    moved = {j for j in p.jobs if changed.fingerprint(j) != p.fingerprint(j)}
    assert moved == {"sums", "rich", "again"}  # a change upstream reaches every job that reads it, no other


CHAIN_BROKEN = [
    (
        "a cycle",
        BASE
        + "  a_t: {from: {view: va}}\n  b_t: {from: {view: vb}}\njobs:\n"
        + "  ja:\n    select: {from: b_t}\n    views: {va: {row: {k: k}, fields: {n: k}}}\n"
        + "  jb:\n    select: {from: a_t}\n    views: {vb: {row: {k: k}, fields: {n: k}}}\n",
        "topics.b_t.from",
        "jobs ja -> jb -> ja read each other's views (ja reads 'b_t' (view 'vb' of 'jb'); jb reads 'a_t' (view 'va'",
    ),
    (
        "a list view",
        BASE
        + "  t: {from: {view: l}}\njobs:\n  j:\n    select: {from: orders}\n"
        + "    views: {l: {list: {c: customer_id}, entry: order_id, order: ts desc, cap: 3}}\n",
        "topics.t.from.view",
        "'l' is a list view, which is not read as a topic (read a view of: row, count, agg, log)",
    ),
    (
        "a key of its own",
        CHAIN.replace("totals: {from: {view: by_customer}}", "totals: {from: {view: by_customer}, key: n}"),
        "topics.totals.key",
        "has the view's key and records",
    ),
    (
        "a type not told",
        CHAIN.replace("fields: {tier: tier}", "fields: {tier: tier, odd: 'mystery(tier)'}"),
        "topics.tiers.from",
        "the type of 'odd' of view 'tier_of' (mystery(tier)) cannot be told from its expression: give it",
    ),
    (
        "a type given for no field",
        CHAIN.replace(
            "tiers: {from: {view: tier_of}}", "tiers: {from: {view: tier_of}, fields: {nope: long}}"
        ),
        "topics.tiers.fields.nope",
        "'nope' is not a field of view 'tier_of'",
    ),
    (
        "a log view without id",
        CHAIN.replace(
            "paid_log: {from: {view: paid_orders}, id: order_id, time: ts}",
            "paid_log: {from: {view: paid_orders}, time: ts}",
        ),
        "topics.paid_log",
        "a topic read from a log view is an event topic: give its `id`",
    ),
    (
        "a log view's time not a timestamp",
        CHAIN.replace("id: order_id, time: ts}", "id: order_id, time: amount}"),
        "topics.paid_log.time",
        "give `time`, a timestamp field of view 'paid_orders'",
    ),
    (
        "a table view with a time",
        CHAIN.replace("tiers: {from: {view: tier_of}}", "tiers: {from: {view: tier_of}, time: ts}"),
        "topics.tiers.time",
        "is keyed by the view's key: remove it",
    ),
]


@pytest.mark.parametrize(("case", "text", "key", "says"), CHAIN_BROKEN, ids=[c[0] for c in CHAIN_BROKEN])
def test_a_broken_chain_is_one_line_that_names_it(case, text, key, says):
    with pytest.raises(PipelineError) as e:
        parse_pipeline(text, "chain.yml", {})
    lines = [p for p in e.value.problems if p.key == key]
    assert len(lines) == 1 and says in lines[0].message, e.value.problems


def test_a_type_given_beside_from_completes_the_topic():
    text = CHAIN.replace("fields: {tier: tier}", "fields: {tier: tier, odd: 'mystery(tier)'}").replace(
        "tiers: {from: {view: tier_of}}", "tiers: {from: {view: tier_of}, fields: {odd: long}}"
    )
    assert dict(parse_pipeline(text, "chain.yml", {}).topics["tiers"].fields)["odd"] == "long"
