// A module of its own, so that the library's go.mod does not gain
// golang.org/x/mod: a tool for .ci/proxy-check.
module github.com/fencelock/fencelock/internal/modproxy

go 1.26.0

require golang.org/x/mod v0.41.0
