#!/usr/bin/env bash
# Installs the system packages elastream's tests and demo need, only when they are missing:
# redis-server (integration tests run a real Redis), a Java runtime (PySpark's local mode and the Kafka test
# broker), openssl (the TLS test makes its own certificates) and maven (scripts/kafka-jars.sh fetches the Kafka
# broker's jars from Maven Central with it).
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)  # promtool checks and unit-tests the chart's alert rules
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "system-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
