# replicad — two commands on a fresh machine: `make run` and `make test`.
# The venv's interpreter: the distribution's CPython 3.11 when it can make a venv and build the native modules
# (ensurepip, Python.h), else the first python3.11 on PATH.  Debian's build has the interpreter linked into the
# executable, like the Docker image's python:3.11; a plain source build such as pyenv's default (a shared
# libpython, no --enable-optimizations) cost ~13 % more CPU per small insert and ~15 % more acknowledgement time
# here.  An existing .venv keeps its interpreter (remove it to make it again).
PY ?= $(shell [ -x /usr/bin/python3.11 ] && /usr/bin/python3.11 -c 'import ensurepip, os, sysconfig, venv; \
        assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null \
        && echo /usr/bin/python3.11 || echo python3.11)
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
STAMP := $(VENV)/.installed

.PHONY: run test bench lint deps apt venv clean unit integration lock chaos

deps: apt venv

apt:
	@need=""; \
	[ -d /usr/share/zookeeper ] || need="$$need zookeeper"; \
	command -v clickhouse-server >/dev/null 2>&1 || [ -x /usr/sbin/clickhouse-server ] || [ -x /usr/bin/clickhouse ] \
	  || need="$$need clickhouse-server clickhouse-client"; \
	command -v java >/dev/null 2>&1 || need="$$need default-jre-headless"; \
	[ -x /usr/sbin/iptables ] || need="$$need iptables"; \
	[ -x /usr/sbin/nft ] || need="$$need nftables"; \
	if [ -n "$$need" ]; then \
	  echo "installing Debian packages:$$need"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need >/dev/null; \
	fi

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock setup.py replicad/native/cityhash102.c replicad/native/strings.c replicad/native/siphash.c replicad/native/bitcodecs.c replicad/native/arraytext.c replicad/native/tsvsplit.c replicad/native/textints.c replicad/native/kmerge.c replicad/native/kgather.c replicad/native/kruns.h replicad/native/string_offsets.h replicad/native/files.c
	@[ -x $(BIN)/python ] || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c requirements.lock -e '.[test,bench]' --config-settings editable_mode=compat
	@touch $(STAMP)

# after changing dependencies in pyproject.toml: install without the pins, then pin what got installed
lock:
	@[ -x $(BIN)/python ] || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test,bench]' --config-settings editable_mode=compat
	$(BIN)/python scripts/lock.py

lint: venv
	$(BIN)/ruff check replicad tests bench scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

# two workers (pytest-xdist), each test file on one of them: most integration tests wait on servers, so two
# files at a time fit the 2 cores; every worker has its own ZooKeeper and draws its own ports
TEST_WORKERS ?= 2
test: deps lint
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=30 -n $(TEST_WORKERS) --dist loadfile tests

unit: venv
	$(BIN)/python -m pytest -q tests/unit

integration: deps
	$(BIN)/python -m pytest -q tests/integration

# the fault suite (tests/chaos): planted-bug proofs, then RUNS random schedules from SEED (MIXED more with a
# ClickHouse 18.16 member, S3 more with the table on an S3 disk, zero-copy); writes RELIABILITY.md.
# SCHEDULE=a,b,c gives every run those nemeses instead of the seed's draw (to replay a failing run).
SEED ?= 1
RUNS ?= 3
MIXED ?= 0
S3 ?= 0
SCHEDULE ?=
chaos: deps
	$(BIN)/python -m tests.chaos --seed $(SEED) --runs $(RUNS) --mixed $(MIXED) --s3 $(S3) --schedule "$(SCHEDULE)"

run: deps
	$(BIN)/python -m scripts.run_cluster

bench: deps
	$(BIN)/python -m bench

clean:
	rm -rf run-data bench-data build *.egg-info
