// The kstatus checker of the e2e tier (see main.go). scripts/kstatus-tool.sh builds it with the cli-utils
// version it is asked for (KSTATUS_VERSION) and completes the requirements with `go mod tidy` in its cache dir.
module elastream.dev/tests/kstatus

go 1.24

require sigs.k8s.io/cli-utils v0.37.2
