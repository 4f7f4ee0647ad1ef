#!/usr/bin/env bash
# Runs a single-node Apache Kafka broker (KRaft, no ZooKeeper) on 127.0.0.1 for the integration tests and the demo.
#
#   scripts/kafka.sh fetch    fetch the broker's jars into the cache only
#   scripts/kafka.sh libs     the same, then print the folder that holds them (for the tests' Java helpers)
#   scripts/kafka.sh start    fetch the broker's jars (first run only), format a fresh data dir, start, wait until ready
#   scripts/kafka.sh stop     stop the broker started by `start` and delete its data
#   scripts/kafka.sh status   say whether it runs (exit 0) or not (exit 3)
#
# Cluster mode (KAFKA_NODES=3): three KRaft nodes on 127.0.0.1, each broker and controller, node N's client port
# KAFKA_PORT + 2(N-1) and its controller port the next one; internal topics and new topics get 3 replicas and
# min.insync.replicas=2. `start`, `stop` and `status` act on all nodes, and:
#   scripts/kafka.sh kill-node N    SIGKILL node N (its data stays)
#   scripts/kafka.sh start-node N   start node N again on its data, and wait until it is ready
#
# Environment:
#   KAFKA_VERSION         the Apache Kafka release to run: 4.4.0 (the default), or another, such as 3.9.1; each
#                         version's jars are fetched once and cached apart (in $KAFKA_CACHE_DIR/libs-<version>)
#   KAFKA_PORT            client port (default 19092); the controller listens on KAFKA_PORT + 1
#   KAFKA_START_TIMEOUT   seconds to wait for the broker to be ready (default 90)
#   KAFKA_STOP_TIMEOUT    seconds to wait after SIGTERM before SIGKILL (default 30)
#   KAFKA_CACHE_DIR       where jars and broker state live (default <project>/.cache/kafka)
#   KAFKA_KEEP_LOGS=1     `stop` keeps the broker's logs (in $KAFKA_CACHE_DIR/run-<port>/logs)
#   KAFKA_WATCH_PID       `start` also stops the broker when this process exits (the test runner passes its pid)
#   KAFKA_NODES           1 (the default) or 3: a single broker, or a cluster of three
#
# On success `start` prints `KAFKA_BROKERS=127.0.0.1:<port>[,...]` on stdout; everything else goes to stderr.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROJECT_DIR="$(cd "$SCRIPT_DIR/.." && pwd)"

KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
KAFKA_PORT="${KAFKA_PORT:-19092}"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
CACHE_DIR="${KAFKA_CACHE_DIR:-$PROJECT_DIR/.cache/kafka}"
LIBS_DIR="$CACHE_DIR/libs-$KAFKA_VERSION"
POM_TEMPLATE="$SCRIPT_DIR/kafka/pom.xml"

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() {
  log "$*"
  exit 1
}

if ! [[ "$KAFKA_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  die "KAFKA_VERSION must be a release number such as 3.9.1 or 4.4.0, got '$KAFKA_VERSION'"
fi
if ! [[ "$KAFKA_PORT" =~ ^[0-9]+$ ]] || ((KAFKA_PORT < 1 || KAFKA_PORT > 65534)); then
  die "KAFKA_PORT must be a port number below 65535, got '$KAFKA_PORT'"
fi
NODES="${KAFKA_NODES:-1}"
[[ "$NODES" == "1" || "$NODES" == "3" ]] || die "KAFKA_NODES must be 1 or 3, got '$NODES'"
BASE_PORT="$KAFKA_PORT"
# One state dir per port, so brokers on different ports do not step on each other.
if [[ "$NODES" == "1" ]]; then CLUSTER_DIR="$CACHE_DIR/run-$BASE_PORT"; else CLUSTER_DIR="$CACHE_DIR/run-$BASE_PORT-cluster"; fi

# Points the per-node variables at node $1 (1 for the single broker).
node() {
  NODE_ID="$1"
  KAFKA_PORT=$((BASE_PORT + 2 * (NODE_ID - 1)))
  CONTROLLER_PORT=$((KAFKA_PORT + 1))
  if [[ "$NODES" == "1" ]]; then RUN_DIR="$CLUSTER_DIR"; else RUN_DIR="$CLUSTER_DIR/node-$NODE_ID"; fi
  PID_FILE="$RUN_DIR/kafka.pid"
  LOG_DIR="$RUN_DIR/logs"
  DATA_DIR="$RUN_DIR/data"
}
node 1

# Every node's client address, comma-separated.
brokers_list() {
  local out="" i
  for i in $(seq 1 "$NODES"); do out+="${out:+,}127.0.0.1:$((BASE_PORT + 2 * (i - 1)))"; done
  echo "$out"
}

# The controller quorum: every node's controller.
voters() {
  local out="" i
  for i in $(seq 1 "$NODES"); do out+="${out:+,}$i@127.0.0.1:$((BASE_PORT + 2 * (i - 1) + 1))"; done
  echo "$out"
}

usage() {
  cat >&2 <<EOF
usage: $0 fetch|start|stop|status|kill-node N|start-node N
  fetch         fetch the broker's jars into the cache (start does this too)
  libs          fetch them if needed, and print the folder that holds them (kafka-clients too, for Java helpers)
  start         start a single-node Kafka broker on 127.0.0.1:\$KAFKA_PORT (default 19092), or with KAFKA_NODES=3 a
                cluster of three; \$KAFKA_VERSION picks the release (default 4.4.0; 3.9.1 too)
  stop          stop it and delete its data
  status        exit 0 when it runs, 3 when it does not
  kill-node N   (KAFKA_NODES=3) SIGKILL node N, keeping its data
  start-node N  (KAFKA_NODES=3) start node N again on its data
EOF
  exit 2
}

require_tools() {
  local missing=()
  command -v java >/dev/null 2>&1 || missing+=("java (17 or later)")
  if [[ ! -f "$LIBS_DIR/.complete" ]]; then
    command -v mvn >/dev/null 2>&1 || missing+=("mvn (Maven, to fetch the broker's jars once)")
  fi
  if ((${#missing[@]} > 0)); then
    log "cannot start a Kafka broker: missing ${missing[*]}."
    log "Install them, or point the tests at a broker you already run:"
    log "  KAFKA_BROKERS=host:port npm test"
    exit 1
  fi
}

# The pid of the broker started by `start`, if that process still runs; empty otherwise. The command line is checked so
# that a pid reused by an unrelated process is never signalled.
running_pid() {
  [[ -f "$PID_FILE" ]] || return 0
  local pid
  pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  if [[ -r "/proc/$pid/cmdline" ]]; then
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "kafka.Kafka $RUN_DIR/server.properties"; then
      echo "$pid"
    fi
  elif kill -0 "$pid" 2>/dev/null; then
    echo "$pid"
  fi
}

# The version `start` ran on this port, when it wrote it down.
running_version() {
  cat "$CLUSTER_DIR/kafka-version" 2>/dev/null || true
}

port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# What the cached jars of this version were fetched for: the version and the pom that listed them.
libs_stamp() {
  echo "$KAFKA_VERSION $(sha256sum "$POM_TEMPLATE" | cut -d' ' -f1)"
}

# Jars fetched before they were cached per version ($CACHE_DIR/libs) are taken over when they are this version's:
# hard links, so that a broker still running from the old directory keeps every jar it has not opened yet.
adopt_old_libs() {
  local old="$CACHE_DIR/libs"
  [[ -f "$old/.complete" && -f "$old/kafka_2.13-$KAFKA_VERSION.jar" ]] || return 1
  ls "$old"/slf4j-reload4j-1.7.36.jar >/dev/null 2>&1 || return 1
  local work="$CACHE_DIR/adopt.$$"
  rm -rf "$work"
  cp -al "$old" "$work" 2>/dev/null || cp -a "$old" "$work" || {
    rm -rf "$work"
    return 1
  }
  libs_stamp >"$work/.complete"
  rm -rf "$LIBS_DIR"
  mv "$work" "$LIBS_DIR"
  log "using the Apache Kafka $KAFKA_VERSION jars fetched earlier ($old)"
}

fetch_libs() {
  local stamp
  stamp="$(libs_stamp)"
  if [[ -f "$LIBS_DIR/.complete" ]] && [[ "$(cat "$LIBS_DIR/.complete")" == "$stamp" ]]; then
    return 0
  fi
  if adopt_old_libs; then return 0; fi
  log "fetching Apache Kafka $KAFKA_VERSION jars from Maven Central into $LIBS_DIR (first run only, about 100 MB)"
  local work="$CACHE_DIR/fetch.$$"
  rm -rf "$work"
  mkdir -p "$work"
  cp "$POM_TEMPLATE" "$work/pom.xml"
  local attempt
  for attempt in 1 2; do
    rm -rf "$work/libs"
    if mvn -q -B -f "$work/pom.xml" -Dkafka.version="$KAFKA_VERSION" \
      org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$work/libs" >"$work/mvn.log" 2>&1; then
      break
    fi
    if ((attempt == 2)); then
      tail -n 30 "$work/mvn.log" >&2 || true
      rm -rf "$work"
      log "could not fetch the jars of Apache Kafka $KAFKA_VERSION with Maven (log above)."
      die "Point the tests at an existing broker instead: KAFKA_BROKERS=host:port npm test"
    fi
    log "Maven fetch failed, retrying once"
    sleep 2
  done
  [[ -f "$work/libs/kafka_2.13-$KAFKA_VERSION.jar" ]] ||
    die "Maven finished but kafka_2.13-$KAFKA_VERSION.jar is not among the fetched jars"
  echo "$stamp" >"$work/libs/.complete"
  rm -rf "$LIBS_DIR"
  mv "$work/libs" "$LIBS_DIR"
  rm -rf "$work"
  log "fetched $(find "$LIBS_DIR" -name '*.jar' | wc -l) jars"
}

# A KRaft cluster id: 16 random bytes, base64url without padding (22 characters), as Kafka's Uuid prints them.
# Ids starting with '-' are avoided because command-line parsers take them for options.
cluster_id() {
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ "$id" != -* ]] && break
  done
  echo "$id"
}

write_config() {
  local replicas=1 isr=1
  if [[ "$NODES" == "3" ]]; then replicas=3; isr=2; fi
  cat >"$RUN_DIR/server.properties" <<EOF
# KRaft node $NODE_ID of $NODES for tests, written by scripts/kafka.sh.
process.roles=broker,controller
node.id=$NODE_ID
controller.quorum.voters=$(voters)
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DATA_DIR
num.partitions=1
# Internal topics must not ask for more replicas than exist, or groups and transactions hang.
offsets.topic.replication.factor=$replicas
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=1
default.replication.factor=$replicas
min.insync.replicas=$isr
# Tests join groups constantly; do not wait for more members before the first rebalance.
group.initial.rebalance.delay.ms=0
# Groups of the consumer protocol (KIP-848) take their session and heartbeat from the broker: short, as the classic
# groups of the tests ask for theirs (a 6 s session, heartbeats every second).
group.consumer.min.session.timeout.ms=1000
group.consumer.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=100
group.consumer.heartbeat.interval.ms=1000
log.cleaner.dedupe.buffer.size=1048577
# The cleaner sleeps 15 s between runs by default; tests of compacted topics wait for it.
log.cleaner.backoff.ms=500
auto.create.topics.enable=false
EOF

  cat >"$RUN_DIR/log4j.properties" <<EOF
# Broker logs go to a file; the console only gets errors.
log4j.rootLogger=INFO, file, console
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$LOG_DIR/server.log
log4j.appender.file.Append=true
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.Threshold=ERROR
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
log4j.logger.org.apache.kafka.storage.internals.log=WARN
log4j.logger.kafka.log=WARN
EOF
}

# Launches node $NODE_ID's JVM on its (formatted) data dir and waits until it is ready.
launch_node() {
  local classpath="$LIBS_DIR/*"
  local -a jvm=(java -Xms256m -Xmx512m -XX:+UseSerialGC -Djava.awt.headless=true
    "-Dlog4j.configuration=file:$RUN_DIR/log4j.properties" -cp "$classpath")
  local started_at=$SECONDS lines=0
  [[ -f "$LOG_DIR/server.log" ]] && lines=$(grep -c "Kafka Server started" "$LOG_DIR/server.log" || true)
  # setsid: the broker must outlive the shell (and the test runner) that started it, until `stop`.
  # 9>&-: the broker must not inherit (and hold) the start lock.
  setsid "${jvm[@]}" kafka.Kafka "$RUN_DIR/server.properties" \
    </dev/null >>"$LOG_DIR/stdout.log" 2>&1 9>&- &
  local pid=$!
  echo "$pid" >"$PID_FILE"
  LAUNCHED_PID="$pid"
  # A cluster's nodes wait for each other's quorum: their readiness is checked by `wait_ready`, all together.
  [[ "${NO_WAIT:-0}" == "1" ]] && return 0
  wait_ready "$pid" "$lines"
  log "node $NODE_ID started (pid $pid) in $((SECONDS - started_at))s, logs in $LOG_DIR"
}

# Waits until node $NODE_ID's log says it started once more than `$2` times before.
wait_ready() {
  local pid="$1" before="$2"
  local deadline=$((SECONDS + START_TIMEOUT))
  while :; do
    local now=0
    [[ -f "$LOG_DIR/server.log" ]] && now=$(grep -c "Kafka Server started" "$LOG_DIR/server.log" || true)
    if ((now > before)); then
      break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 40 "$LOG_DIR/server.log" "$LOG_DIR/stdout.log" >&2 2>/dev/null || true
      rm -f "$PID_FILE"
      die "node $NODE_ID exited during startup (logs above, in $LOG_DIR)"
    fi
    if ((SECONDS >= deadline)); then
      tail -n 40 "$LOG_DIR/server.log" >&2 2>/dev/null || true
      stop_pid "$pid"
      die "node $NODE_ID was not ready within ${START_TIMEOUT}s (logs in $LOG_DIR)"
    fi
    sleep 0.25
  done
}

start() {
  require_tools
  mkdir -p "$CACHE_DIR"
  # Serialize concurrent `start`s for the same port (e.g. two test runs).
  exec 9>"$CACHE_DIR/.lock-$BASE_PORT"
  flock -w "$((START_TIMEOUT + 600))" 9 || die "timed out waiting for another scripts/kafka.sh on port $BASE_PORT"

  local pid
  pid="$(running_pid)"
  if [[ -n "$pid" ]]; then
    local running
    running="$(running_version)"
    if [[ -n "$running" && "$running" != "$KAFKA_VERSION" ]]; then
      die "Apache Kafka $running already runs on port $BASE_PORT (pid $pid), not $KAFKA_VERSION: stop it first"
    fi
    log "already running (pid $pid)"
    echo "KAFKA_BROKERS=$(brokers_list)"
    return 0
  fi
  local i
  for i in $(seq 1 "$NODES"); do
    node "$i"
    if port_in_use "$KAFKA_PORT" || port_in_use "$CONTROLLER_PORT"; then
      log "port $KAFKA_PORT or $CONTROLLER_PORT is taken by another process."
      die "Set KAFKA_PORT to start on other ports, or use that broker: KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT npm test"
    fi
  done

  fetch_libs

  rm -rf "$CLUSTER_DIR"
  mkdir -p "$CLUSTER_DIR"
  echo "$KAFKA_VERSION" >"$CLUSTER_DIR/kafka-version"
  local id
  id="$(cluster_id)"
  local classpath="$LIBS_DIR/*"
  local started_at=$SECONDS
  local -a pids=()
  for i in $(seq 1 "$NODES"); do
    node "$i"
    mkdir -p "$RUN_DIR" "$LOG_DIR" "$DATA_DIR"
    write_config
    java -Xms128m -Xmx256m -XX:+UseSerialGC -Djava.awt.headless=true \
      "-Dlog4j.configuration=file:$RUN_DIR/log4j.properties" -cp "$classpath" \
      kafka.tools.StorageTool format -t "$id" -c "$RUN_DIR/server.properties" >"$LOG_DIR/format.log" 2>&1 || {
      cat "$LOG_DIR/format.log" >&2
      die "formatting the data dir of node $i failed"
    }
    NO_WAIT=1 launch_node
    pids+=("$LAUNCHED_PID")
  done
  for i in $(seq 1 "$NODES"); do
    node "$i"
    wait_ready "${pids[$((i - 1))]}" 0
  done
  if [[ "${KAFKA_WATCH_PID:-}" =~ ^[0-9]+$ ]]; then
    # Stops the broker once the process that asked for it is gone, even when that process was killed before it could
    # call `stop` (a test runner under `timeout`, say).
    KAFKA_PORT="$BASE_PORT" KAFKA_NODES="$NODES" KAFKA_CACHE_DIR="$CACHE_DIR" setsid bash -c '
      while kill -0 "$1" 2>/dev/null && [[ -d "$2" ]]; do sleep 2; done
      if [[ -d "$2" ]]; then bash "$3" stop; fi
    ' kafka-watch "$KAFKA_WATCH_PID" "$CLUSTER_DIR" "$SCRIPT_DIR/kafka.sh" </dev/null >/dev/null 2>&1 9>&- &
  fi
  log "started ${NODES} node(s) of Apache Kafka $KAFKA_VERSION (pids ${pids[*]}) in $((SECONDS - started_at))s, logs in $CLUSTER_DIR"
  echo "KAFKA_BROKERS=$(brokers_list)"
}

# Points the per-node variables at the node a cluster command names, or dies saying why it cannot.
cluster_node() {
  [[ "$NODES" == "3" ]] || die "$1 needs KAFKA_NODES=3"
  [[ "${2:-}" =~ ^[1-3]$ ]] || die "$1 takes a node number from 1 to 3, got '${2:-}'"
  node "$2"
}

kill_node() {
  cluster_node kill-node "${1:-}"
  local pid
  pid="$(running_pid)"
  [[ -n "$pid" ]] || die "node $1 is not running"
  kill -KILL "$pid"
  local i
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  log "node $1 killed (pid $pid)"
}

start_node() {
  cluster_node start-node "${1:-}"
  [[ -f "$RUN_DIR/server.properties" ]] || die "node $1 was never started; run start first"
  # A node comes back on the release its data was written by, whatever KAFKA_VERSION says now.
  local recorded
  recorded="$(running_version)"
  if [[ -n "$recorded" ]]; then
    KAFKA_VERSION="$recorded"
    LIBS_DIR="$CACHE_DIR/libs-$KAFKA_VERSION"
  fi
  [[ -z "$(running_pid)" ]] || die "node $1 is running already"
  launch_node
}

stop_pid() {
  local pid="$1"
  kill -TERM "$pid" 2>/dev/null || return 0
  local deadline=$((SECONDS + STOP_TIMEOUT))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      log "no exit ${STOP_TIMEOUT}s after SIGTERM, sending SIGKILL to $pid"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  # The shell that started the broker may be gone, so there may be no `wait` to reap it; poll until it disappears.
  local i
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
}

stop() {
  local i pid
  for i in $(seq 1 "$NODES"); do
    node "$i"
    pid="$(running_pid)"
    if [[ -z "$pid" ]]; then
      log "node $i not running on port $KAFKA_PORT"
    else
      stop_pid "$pid"
      log "stopped node $i (pid $pid)"
    fi
  done
  # KAFKA_KEEP_LOGS=1 keeps the broker's logs for inspection; the data always goes.
  if [[ "${KAFKA_KEEP_LOGS:-0}" == "1" ]]; then
    for i in $(seq 1 "$NODES"); do
      node "$i"
      rm -rf "$DATA_DIR" "$PID_FILE"
    done
  else
    rm -rf "$CLUSTER_DIR"
  fi
}

status() {
  local i pid down=0 version
  version="$(running_version)"
  for i in $(seq 1 "$NODES"); do
    node "$i"
    pid="$(running_pid)"
    if [[ -n "$pid" ]]; then
      echo "node $i running (pid $pid) on 127.0.0.1:$KAFKA_PORT${version:+, Apache Kafka $version}"
    else
      echo "node $i not running on port $KAFKA_PORT"
      down=1
    fi
  done
  if ((down == 1)); then exit 3; fi
  echo "KAFKA_BROKERS=$(brokers_list)"
}

case "${1:-}" in
  fetch)
    require_tools
    fetch_libs
    ;;
  libs)
    require_tools
    fetch_libs
    echo "$LIBS_DIR"
    ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  kill-node) kill_node "${2:-}" ;;
  start-node) start_node "${2:-}" ;;
  *) usage ;;
esac
