# mview: stream joins and incrementally maintained materialized views on Spark, Delta Lake and Redis.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
MVIEW := $(VENV)/bin/mview
REDIS_URL ?= redis://127.0.0.1:6379/0
export REDIS_URL
JOB ?= timeline
VIEW ?= timeline
KEY ?= u1
BENCH_ARGS ?=
WEB_PORT ?= 8765
UI_PORT ?= 8764

.DEFAULT_GOAL := help
.PHONY: help setup redis redis-cluster postgres postgres-stop kafka kafka-stop hdfs hdfs-stop s3 s3-stop spark-cluster spark-cluster-stop test test-fast lint fmt demo demo-cdc demo-web ui jvm-cache peers-setup bench deploy stop status query export replay maintain clean

help: ## list every target with a one-line comment
	@grep -E '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-10s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	@command -v java >/dev/null || { echo "make setup: Java 17+ is needed by Spark: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then (apt-get install -y -qq redis-server >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq redis-server)) ; \
	  else echo "make setup: redis-server is missing: sudo apt-get install -y redis-server"; exit 1; fi; }
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[dev]"
	$(PY) -m jobs.dev.warmup
	touch $@

setup: $(VENV)/.installed ## create .venv, install the project and its dependencies, fetch the Delta jars (idempotent)

redis: setup ## start a development redis-server at REDIS_URL unless one answers there
	@$(PY) -m jobs.dev.redis

redis-cluster: setup ## start a local three-master Redis Cluster on the port of REDIS_URL and the next two (then REDIS_CLUSTER=true)
	@$(PY) -m jobs.dev.redis --cluster

postgres: setup ## start a development PostgreSQL (wal_level=logical, data in LAKE_DIR/postgres) at PG_DSN unless one answers there
	@PG_DSN="$${PG_DSN:-host=127.0.0.1 port=5433 dbname=mview user=mview}" $(PY) -m jobs.dev.postgres

postgres-stop: setup ## stop the PostgreSQL `make postgres` started
	@PG_DSN="$${PG_DSN:-host=127.0.0.1 port=5433 dbname=mview user=mview}" $(PY) -m jobs.dev.postgres stop

kafka: setup ## start a development Kafka broker (KRaft, data in LAKE_DIR/kafka) at KAFKA_BOOTSTRAP (127.0.0.1:9092) unless one answers there
	@KAFKA_BOOTSTRAP="$${KAFKA_BOOTSTRAP:-127.0.0.1:9092}" $(PY) -m jobs.dev.kafka start

kafka-stop: setup ## stop the Kafka broker `make kafka` started
	@$(PY) -m jobs.dev.kafka stop

hdfs: setup ## start a development HDFS (NameNode and DataNode in one JVM, data in LAKE_DIR/hdfs) at HDFS_URL (hdfs://127.0.0.1:9000) unless one answers there
	@$(PY) -m jobs.dev.hdfs start

hdfs-stop: setup ## stop the HDFS `make hdfs` started
	@$(PY) -m jobs.dev.hdfs stop

s3: setup ## start a development S3 server (S3Proxy, bucket mview, objects in LAKE_DIR/s3) at S3_ENDPOINT (http://127.0.0.1:9100) unless one answers there
	@$(PY) -m jobs.dev.s3 start

s3-stop: setup ## stop the S3 server `make s3` started
	@$(PY) -m jobs.dev.s3 stop

spark-cluster: setup ## start a Spark standalone master at the port of SPARK_MASTER (spark://127.0.0.1:7077) and SPARK_WORKERS (2) workers, each in its own directory under LAKE_DIR/spark-cluster
	@$(PY) -m jobs.dev.spark_cluster start

spark-cluster-stop: setup ## stop the master and workers `make spark-cluster` started
	@$(PY) -m jobs.dev.spark_cluster stop

# The suite starts one of each server it needs per run (Redis; and for the e2e tests HDFS, S3, Kafka, PostgreSQL, a
# Spark cluster). The scenarios that run on one remote store per run take MVIEW_TEST_STORE=hdfs|s3 (by default it
# alternates by day); the run's last lines say which, after the 15 slowest tests.
# The suite starts many driver JVMs (deployed jobs, CLI runs): with the JVM cache (a JDK 25+) each starts warmer.
test: setup $(VENV)/mview-jvm/stamp.json ## run the test suite (starts its own redis-server on a free port; builds the JVM cache first)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

# No server beyond Redis: a test that uses one is e2e (tests/conftest.py).
test-fast: setup ## the suite without the slow and end-to-end tests: feedback in a few minutes
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not e2e" tests

lint: setup ## ruff lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

fmt: setup ## ruff format and autofix
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

demo: setup redis ## generate a workload, ingest it, run the timeline job, print and verify timelines
	$(PY) -m timeline_demo

demo-cdc: setup redis postgres ## profiles in PostgreSQL captured by the cdc job: an UPDATE changes the enrichment of later events only, and a replay agrees
	@PG_DSN="$${PG_DSN:-host=127.0.0.1 port=5433 dbname=mview user=mview}" $(PY) -m timeline_demo.cdc_demo

ui: setup ## serve the operations page on :UI_PORT (8764): every job, live charts of batch time, input rate, lag
	$(MVIEW) ui --port $(UI_PORT) --page-url http://127.0.0.1:$(WEB_PORT)/

demo-web: setup redis $(if $(KAFKA),kafka) ## serve the live home-timeline page on :WEB_PORT (8765) while the job runs and new tweets arrive (KAFKA=1: produced to Kafka, copied by the kafka job)
	$(if $(KAFKA),KAFKA_BOOTSTRAP="$${KAFKA_BOOTSTRAP:-127.0.0.1:9092}" )$(PY) -m timeline_demo.web --live $(if $(KAFKA),--kafka )--port $(WEB_PORT)

jvm-cache: setup ## build the driver JVM's AOT cache (needs a JDK 25+; ~2 min): faster cold start of every job
	$(PY) -m jobs.dev.jvmcache

$(VENV)/mview-jvm/stamp.json: $(VENV)/.installed
	$(PY) -m jobs.dev.jvmcache

# The peers bench part's Flink: PyFlink pins py4j, pandas, numpy and pyarrow apart from pyspark's, so it gets a
# virtual environment of its own; the version is the `peers` extra's of pyproject.toml.
PEERS_VENV := .venv-peers
FLINK_PIN = $(shell grep -o '"apache-flink==[^"]*"' pyproject.toml | tr -d '"')

peers-setup: ## create .venv-peers with Apache Flink (PyFlink, the `peers` extra) for the bench's peers part (~700 MB)
	@python3 -m venv $(PEERS_VENV) && $(PEERS_VENV)/bin/pip install -q --upgrade pip && \
	  $(PEERS_VENV)/bin/pip install -q "$(FLINK_PIN)" && $(PEERS_VENV)/bin/python -c "import pyflink" || \
	  { echo "make peers-setup: could not install $(FLINK_PIN) into $(PEERS_VENV): it needs python3 3.8-3.11 (this is $$(python3 --version 2>&1)), Java 11 or 17 and PyPI"; exit 1; }

bench: setup $(VENV)/mview-jvm/stamp.json ## run the benchmarks (building the JVM cache first) and write bench/results.json, the table of docs/bench.md and the README's summary; BENCH_ARGS passes options (--only, --scale, --out ...)
	$(PY) -m bench $(BENCH_ARGS)

deploy: setup redis ## start JOB as a background streaming query (make deploy JOB=timeline)
	$(MVIEW) deploy $(JOB)

stop: setup ## stop the deployed JOB after its batch in flight
	$(MVIEW) stop $(JOB)

status: setup ## per job: running, generation, lag, counts
	$(MVIEW) status

query: setup ## one key of a view (make query VIEW=timeline KEY=u1)
	$(MVIEW) query $(VIEW) $(KEY)

export: setup ## every key of a view as JSON lines (make export VIEW=timeline)
	$(MVIEW) export $(VIEW)

replay: setup redis ## rebuild JOB's views into a new generation and switch atomically
	$(MVIEW) replay $(JOB)

maintain: setup redis ## one maintenance round: compact, OPTIMIZE, VACUUM logs and state, drop old generations
	$(MVIEW) maintain --once

clean: ## remove the lake (logs, state, checkpoints) under LAKE_DIR (default ./lake)
	rm -rf $${LAKE_DIR:-./lake}
