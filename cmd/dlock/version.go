package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3"
// (the Makefile's build target passes git describe); otherwise it comes
// from the module build info (a `go install ...@v1.2.3` build), else it is
// "devel".
var version = ""

func versionString() string {
	v := version
	if v == "" {
		v = "devel"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
	}
	return v
}

const versionUsage = `Usage: dlock version

Prints dlock's version (set at build time from git describe by 'make
build', or the module version a 'go install' build records), the Go
version it was built with and the platform:

  dlock v0.3.0 (go1.26.8 linux/amd64)
`

func cmdVersion(args []string, stdout, stderr io.Writer) int {
	o := newOptions("version", versionUsage)
	rest, code, ok := o.Parse(args, stdout, stderr)
	if !ok {
		return code
	}
	if len(rest) > 0 {
		return o.UsageError(stderr, "unexpected argument %s", oneLine(rest[0]))
	}
	fmt.Fprintf(stdout, "dlock %s (%s %s/%s)\n", versionString(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return 0
}
