"""The fan-out part of `python -m bench`: celebrities fanned out on write against fanned out on read
(`FANOUT_LIMIT`), all with the timeline job deployed (`mview deploy timeline`, its own JVM).

- celebrity: one tweet by an author with 1,000,000 followers, from its append (the return of `mview ingest`) to
  its presence in every follower's timeline, with the job at `TRIGGER_INTERVAL=200 ms` (`bench.kafka.TRIGGER`, the
  setting for fresh views), and the hybrid at the 500-ms default too. The first celebrity tweet after a deployment
  plans and compiles that path: it is measured and reported apart (`first_s`), not in p50/p99. Visible means: `read_timeline` of a sample of followers returns it,
  and a check over all followers holds (fan-out on write: every follower's timeline key holds it; hybrid: the
  author's authored set holds it and every follower's celebrity set names the author), the check timed apart.
- reads: `read_timeline` calls per second and their latency from one Python client, plain (no limit) against
  hybrid (a limit below the celebrities' follower counts), both jobs deployed at once over the throughput
  workload and written to by a trickle of tweets while the reads run; plain and hybrid reads alternate.
- memory: Redis memory per timeline entry after `mview run timeline --once` over the throughput workload, on a
  scratch redis-server, with Redis's default sorted-set encoding thresholds and with `zset-max-listpack-entries`
  raised to the timeline cap (capped timelines stay listpacks), against the payload (tweet id bytes + 8 of score),
  and the Redis-side cost of the sink's ZADD in each (INFO commandstats).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from pathlib import Path

from bench.common import ingest_records, say, scratch_settings, start_redis
from bench.kafka import TRIGGER

__all__ = ["bench_fanout"]

_CELEB = "celeb"
_OTHER = "other"  # followed by one follower: its tweet is the probe that says the job caught up

# KEYS: keys to check; ARGV[1]: 'z' (sorted set: ARGV[2] a member) or 's' (set: ARGV[2] a member). Returns how
# many of the keys do not hold the member.
_MISSING_LUA = """
local n = 0
for _, k in ipairs(KEYS) do
  local hit
  if ARGV[1] == 'z' then hit = redis.call('ZSCORE', k, ARGV[2]) else hit = redis.call('SISMEMBER', k, ARGV[2]) == 1 end
  if not hit then n = n + 1 end
end
return n
"""


def _pct(xs: list[float], p: float):
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(p * len(xs)))], 3) if xs else None


def _tweet(tid: str, author: str) -> dict:
    return {"op": "post", "tweet_id": tid, "user_id": author, "text": tid, "ts": int(time.time() * 1000)}


def _follow_file(tmp: Path, followers: int) -> str:
    from timeline_demo.workload import write_jsonl

    recs = [
        {"op": "follow", "follower_id": f"f{i:07d}", "followee_id": _CELEB, "ts": 1_700_000_000_000}
        for i in range(followers)
    ]
    recs.append({"op": "follow", "follower_id": "f0000000", "followee_id": _OTHER, "ts": 1_700_000_000_000})
    return write_jsonl(recs, tmp / "fan-follows.jsonl")


def _deployed(settings):
    from bench.freshness import deploy_jobs

    return deploy_jobs(settings, ("timeline",))


def _wait_visible(client, user: str, tid: str, timeout_s: float = 600.0) -> float:
    """Seconds until `read_timeline(user)` returns `tid`."""
    from timeline_demo.timeline_view import read_timeline

    t0 = time.monotonic()
    while tid not in {t["tweet_id"] for t in read_timeline(client, user, 20)["tweets"]}:
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{tid} not in {user}'s timeline after {timeout_s:.0f}s (see the job's log)")
        time.sleep(0.02)
    return time.monotonic() - t0


def _all_hold(client, hybrid: bool, followers: int, tid: str) -> bool:
    """Whether every follower sees `tid`: their timeline keys hold it (fan-out on write), or the celebrity's
    authored set holds it and every follower's celebrity set names the celebrity (hybrid)."""
    from timeline_demo.timeline_view import authored_key, celebs_key, timeline_key
    from views.redis_io import current_generation

    gen = current_generation(client, "timeline")
    if hybrid and client.zscore(authored_key(gen, _CELEB), tid) is None:
        return False
    key, kind, want = (celebs_key, "s", _CELEB) if hybrid else (timeline_key, "z", tid)
    script = client.register_script(_MISSING_LUA)
    pipe = client.pipeline(transaction=False)
    for i in range(0, followers, 10_000):
        keys = [key(gen, f"f{j:07d}") for j in range(i, min(followers, i + 10_000))]
        script(keys=keys, args=[kind, want], client=pipe)
    return sum(pipe.execute()) == 0


def _time_one_tweet(
    settings, tmp: Path, client, tid: str, sample: list[str], hybrid: bool, followers: int
) -> dict:
    """Append the celebrity tweet `tid` and time it: the append, then until every user of `sample` sees it, then
    until every follower does (each check of all of them timed, repeated until one holds)."""
    t0 = time.monotonic()
    ingest_records(None, settings, "tweets", [_tweet(tid, _CELEB)], tmp / f"{tid}.jsonl")
    t_app = time.monotonic()
    for u in sample:
        _wait_visible(client, u, tid)
    seen = time.monotonic() - t_app
    checks = []
    while True:
        c0 = time.monotonic()
        ok = _all_hold(client, hybrid, followers, tid)
        checks.append(time.monotonic() - c0)
        if ok:
            break
    visible = seen if len(checks) == 1 else time.monotonic() - t_app
    say(f"fanout: {tid}: visible to all {followers:,} after {visible:.2f}s (check {checks[-1]:.1f}s)")
    return {
        "append_s": round(t_app - t0, 3),
        "visible_s": round(visible, 3),
        "check_s": round(checks[-1], 2),
        "checks": len(checks),
    }


def _one_mode(settings, tmp: Path, follow_file: str, followers: int, hybrid: bool, tweets: int) -> dict:
    """Deploy the job over the 1M follows, then append a first celebrity tweet and `tweets` more, one at a time, each
    once the previous one is visible everywhere."""
    from changelog.ingest import ingest
    from views.redis_io import connect

    client = connect(settings.redis_url)
    started = time.monotonic()
    ingest(None, settings.lake, settings.topic("follows"), [follow_file])
    ingest_s = time.monotonic() - started
    stop = _deployed(settings)
    tag = ("h" if hybrid else "w") + settings.trigger_interval.split()[0]
    try:
        ingest_records(None, settings, "tweets", [_tweet(f"probe{tag}", _OTHER)], tmp / f"probe{tag}.jsonl")
        catch_up = _wait_visible(client, "f0000000", f"probe{tag}")
        say(
            f"fanout: {'hybrid' if hybrid else 'write'} deployed, caught up with {followers:,} follows in {catch_up:.0f}s"
        )
        sample = [f"f{i:07d}" for i in range(0, followers, max(1, followers // 20))] + [
            f"f{followers - 1:07d}"
        ]
        rows = []
        for n in range(tweets + 1):
            rows.append(_time_one_tweet(settings, tmp, client, f"c{tag}{n}", sample, hybrid, followers))
    finally:
        stop()
    first, rows = rows[0], rows[1:]
    vis = [r["visible_s"] for r in rows]
    used = int(client.info("memory")["used_memory"])
    client.flushdb()
    return {
        "fanout_limit": settings.pipeline().views["timeline"].fanout_limit,
        "trigger_interval": settings.trigger_interval,
        "first_s": first["visible_s"],
        "ingest_follows_s": round(ingest_s, 1),
        "catch_up_s": round(catch_up, 1),
        "tweets": rows,
        "p50_s": _pct(vis, 0.5),
        "p99_s": _pct(vis, 0.99),
        "max_s": max(vis),
        "check_s": round(statistics.median(r["check_s"] for r in rows), 2),
        "used_memory_mb": round(used / 2**20),
    }


def _celebrity(
    tmp: Path, port: int, followers: int, limit: int, write_tweets: int, hybrid_tweets: int
) -> dict:
    follow_file = _follow_file(tmp, followers)
    out = {"followers": followers, "command": "mview deploy timeline; mview ingest tweets (1 tweet)"}
    for name, lim, n, db, trigger in (
        ("write", "", write_tweets, 5, TRIGGER),
        ("hybrid", limit, hybrid_tweets, 6, TRIGGER),
        ("hybrid_default_trigger", limit, hybrid_tweets, 4, "500 ms"),
    ):
        settings = scratch_settings(
            tmp / f"lake-fan-{name}", port, db, FANOUT_LIMIT=lim, METRICS_PORT="off", TRIGGER_INTERVAL=trigger
        )
        out[name] = _one_mode(settings, tmp, follow_file, followers, lim != "", n)
    return out


def _trickle(
    settings_list, tmp: Path, authors: list[str], stop: threading.Event, every_s: float
) -> list[int]:
    """Append 5 tweets to every lake of `settings_list` every `every_s` until `stop`; [tweets appended]."""
    rng, n = random.Random(3), [0]
    while not stop.is_set():
        tick = time.monotonic()
        recs = [_tweet(f"trickle{n[0] + i}", rng.choice(authors)) for i in range(5)]
        for s in settings_list:
            ingest_records(None, s, "tweets", recs, tmp / f"trickle-{s.redis_url[-1]}.jsonl")
        n[0] += 5
        stop.wait(max(0.0, every_s - (time.monotonic() - tick)))
    return n


def _read_while_trickling(
    modes: dict, clients: dict, tmp: Path, authors: list[str], users: list[str], seconds: float, page: int
) -> tuple[dict[str, list[float]], list[int]]:
    """For `seconds`, read the first `page` entries of a random user's timeline from each mode in turn (the same
    user in both) while 5 tweets by `authors` are appended to each every second: ({mode: read seconds},
    [tweets appended])."""
    from timeline_demo.timeline_view import read_timeline

    stop_trickle = threading.Event()
    appended: list[int] = []
    writer = threading.Thread(
        target=lambda: appended.extend(_trickle(list(modes.values()), tmp, authors, stop_trickle, 1.0)),
        daemon=True,
    )
    writer.start()
    lat: dict[str, list[float]] = {k: [] for k in modes}
    rng, t_end = random.Random(9), time.monotonic() + seconds
    while time.monotonic() < t_end:
        user = rng.choice(users)
        for k in modes:
            t0 = time.perf_counter()
            read_timeline(clients[k], user, page)
            lat[k].append(time.perf_counter() - t0)
    stop_trickle.set()
    writer.join(30)
    return lat, appended


def _read_figures(xs: list[float]) -> dict:
    """Reads, reads per second of reading, p50 and p99 in milliseconds of the read times `xs`."""
    return {
        "reads": len(xs),
        "reads_per_s": round(len(xs) / sum(xs)),
        "p50_ms": round(1000 * sorted(xs)[min(len(xs) - 1, int(0.5 * len(xs)))], 3),
        "p99_ms": round(1000 * sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))], 3),
    }


def _reads(spark, tmp: Path, port: int, scale: float, seconds: float, page: int) -> dict:
    from bench.freshness import _followers
    from bench.timeline import ingest_workload, throughput_workload
    from views.redis_io import connect

    wl = throughput_workload(scale)
    followers = _followers(wl.follows)
    counts = sorted((len(v) for v in followers.values()), reverse=True)
    limit = counts[2] - 1  # below the 3 celebrities' follower counts
    modes = {}
    for name, lim, db in (("plain", "", 7), ("hybrid", limit, 8)):
        modes[name] = scratch_settings(
            tmp / f"lake-reads-{name}", port, db, FANOUT_LIMIT=lim, METRICS_PORT="off"
        )
        ingest_workload(spark, modes[name], wl, tmp)
    stops = [_deployed(s) for s in modes.values()]
    clients = {k: connect(s.redis_url) for k, s in modes.items()}
    top = min(followers, key=lambda a: (-len(followers[a]), a))
    try:
        for k, s in modes.items():  # a probe by the top author (a celebrity in hybrid: read, not a key check)
            ingest_records(None, s, "tweets", [_tweet(f"probe-{k}", top)], tmp / f"probe-{k}.jsonl")
            took = _wait_visible(clients[k], followers[top][0], f"probe-{k}")
            say(f"fanout: reads: {k} job deployed, caught up in {took:.0f}s")
        users = sorted({f["follower_id"] for f in wl.follows})
        celeb_fans = set().union(
            *(followers[a] for a in sorted(followers, key=lambda a: -len(followers[a]))[:3])
        )
        lat, appended = _read_while_trickling(modes, clients, tmp, sorted(followers), users, seconds, page)
    finally:
        for stop in stops:
            stop()
    for c in clients.values():
        c.flushdb()
    out = {
        "workload": f"throughput workload ({len(users):,} readers, {len(celeb_fans) / len(users):.0%} follow a "
        f"celebrity), FANOUT_LIMIT {limit} for hybrid (celebrities' followers {counts[:3]}), pages of {page}, "
        f"{appended[0] if appended else 0} tweets appended at 5/s to each while reading",
        "fanout_limit": limit,
        "read_seconds": seconds,
    }
    for k, xs in lat.items():
        out[k] = _read_figures(xs)
    out["p99_ratio"] = round(out["hybrid"]["p99_ms"] / out["plain"]["p99_ms"], 2)
    return out


def _timeline_memory(client, gen: int) -> tuple[int, int, int, dict]:
    """(entries, bytes of MEMORY USAGE of every timeline key, payload bytes, {encoding: keys})."""
    from views.keys import view_pattern

    keys = list(client.scan_iter(match=view_pattern("timeline", gen), count=1000))
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.memory_usage(k, samples=0)
        pipe.object("encoding", k)
        pipe.zrange(k, 0, -1)
    replies = pipe.execute()
    entries = used = payload = 0
    enc: dict[str, int] = {}
    for i in range(0, len(replies), 3):
        used += replies[i]
        e = replies[i + 1].decode() if isinstance(replies[i + 1], bytes) else str(replies[i + 1])
        enc[e] = enc.get(e, 0) + 1
        entries += len(replies[i + 2])
        payload += sum(len(m) + 8 for m in replies[i + 2])
    return entries, used, payload, enc


def _memory(spark, tmp: Path, scale: float) -> dict:
    from bench.timeline import ingest_workload, throughput_workload
    from timeline_demo.timeline_view import run_timeline
    from views.redis_io import connect

    (tmp / "mem").mkdir(exist_ok=True)
    proc, port = start_redis(tmp / "mem")
    try:
        settings = scratch_settings(tmp / "lake-mem", port, 0, FANOUT_LIMIT="", METRICS_PORT="off")
        ingest_workload(spark, settings, throughput_workload(scale), tmp)
        client = connect(settings.redis_url)
        cap = settings.pipeline().views["timeline"].cap
        out = {"command": "mview run timeline --once (scratch redis-server)", "cap": cap}
        for name, gen, conf in (("default", 1, None), ("listpack", 2, cap)):
            client.flushall()
            if conf:
                client.config_set("zset-max-listpack-entries", conf)
            client.config_resetstat()
            before = int(client.info("memory")["used_memory"])
            totals = run_timeline(spark, settings, once=True, generation=gen)
            after = int(client.info("memory")["used_memory"])
            entries, used, payload, enc = _timeline_memory(client, gen)
            stats = client.info("commandstats")
            out[name] = {
                "zset_max_listpack_entries": int(
                    client.config_get("zset-max-listpack-entries")["zset-max-listpack-entries"]
                ),
                "entries": entries,
                "timeline_keys_bytes_per_entry": round(used / entries, 1),
                "used_memory_delta_per_entry": round((after - before) / entries, 1),
                "payload_bytes_per_entry": round(payload / entries, 1),
                "encodings": enc,
                "zadd_usec_per_call": stats.get("cmdstat_zadd", {}).get("usec_per_call"),
                "zadd_usec_per_entry": round(stats.get("cmdstat_zadd", {}).get("usec", 0) / entries, 3),
                "zremrangebyrank_usec_per_call": stats.get("cmdstat_zremrangebyrank", {}).get(
                    "usec_per_call"
                ),
                "batch_seconds": round(totals["seconds"], 2),
                "entries_per_s": round(totals["entries"] / totals["seconds"]) if totals["seconds"] else None,
            }
            say(f"fanout: memory {name}: {out[name]}")
        return out
    finally:
        proc.terminate()
        proc.wait(10)


def bench_fanout(
    spark,
    tmp: Path,
    port: int,
    *,
    followers: int = 1_000_000,
    limit: int = 10_000,
    write_tweets: int = 3,
    hybrid_tweets: int = 20,
    read_seconds: float = 20.0,
    page: int = 50,
    scale: float = 1.0,
) -> dict:
    """The three measurements (see the module docstring), each `{"error": ...}` alone when it failed."""
    out: dict = {}
    for name, fn in (
        ("memory", lambda: _memory(spark, tmp, scale)),
        ("reads", lambda: _reads(spark, tmp, port, scale, read_seconds, page)),
        ("celebrity", lambda: _celebrity(tmp, port, followers, limit, write_tweets, hybrid_tweets)),
    ):
        started = time.monotonic()
        try:
            out[name] = fn()
        except Exception as e:  # one failed measurement must not lose the others'
            out[name] = {"error": f"{type(e).__name__}: {e}"}
        out[name]["seconds"] = round(time.monotonic() - started, 1)
    return out
