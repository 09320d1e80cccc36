package testserver

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// TairStringEnv names a built TairString module (a .so file) for the
// tests to load instead of building one.
const TairStringEnv = "DLOCK_TAIRSTRING"

// TairStringModule returns the path of the TairString module, a test
// fixture that adds Tair's CAS and CAD commands to redis-server: the file
// $DLOCK_TAIRSTRING names, else the module built from the tairstring
// folder beside the checkout (../shared/tairstring, by its build.sh, with
// gcc) into the user's cache directory, rebuilt when a source file is
// newer. Where neither is available it fails the test when CI is set and
// skips it otherwise, saying how to provide it.
func TairStringModule(t TB) string {
	t.Helper()
	if p := os.Getenv(TairStringEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", TairStringEnv, p, err)
		}
		return p
	}
	tairOnce.Do(func() { tairPath, tairErr = buildTairString() })
	if tairErr != nil {
		msg := fmt.Sprintf("the TairString module is not available: %v; run `make deps` in a checkout with ../shared/tairstring beside it, or set %s to a built tairstring.so", tairErr, TairStringEnv)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return tairPath
}

// WithTairString loads the TairString module (TairStringModule) into the
// server.
func WithTairString(t TB) RedisOption {
	t.Helper()
	return WithArgs("--loadmodule", TairStringModule(t))
}

var (
	tairOnce sync.Once
	tairPath string
	tairErr  error
)

// TairStringSource returns the tairstring folder beside the checkout that
// holds the working directory: the parent of the directory with go.work.
func TairStringSource() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return tairStringSourceFrom(dir)
}

func tairStringSourceFrom(dir string) (string, error) {
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			src := filepath.Join(dir, "..", "shared", "tairstring")
			if _, err := os.Stat(filepath.Join(src, "build.sh")); err != nil {
				return "", fmt.Errorf("no %s beside the checkout", filepath.Join("..", "shared", "tairstring", "build.sh"))
			}
			return src, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.work above the working directory")
		}
		dir = parent
	}
}

// TairStringTarget is where a build of the module goes: the user's cache
// directory (make deps builds it there too).
func TairStringTarget() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "dlock", "tairstring.so"), nil
}

// buildTairString builds the module into TairStringTarget unless a build
// there is newer than every source file. The build goes to a temporary
// name and is renamed into place, so test processes building at once do
// not load a half-written file.
func buildTairString() (string, error) {
	src, err := TairStringSource()
	if err != nil {
		return "", err
	}
	out, err := TairStringTarget()
	if err != nil {
		return "", err
	}
	newest, err := newestFile(src)
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(out); err == nil && st.ModTime().After(newest) {
		return out, nil
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
	cmd := exec.Command("bash", filepath.Join(src, "build.sh"), tmp)
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("%s: %v: %s", filepath.Join(src, "build.sh"), err, b)
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return out, nil
}

// newestFile is the latest modification time of the files below dir.
func newestFile(dir string) (time.Time, error) {
	var newest time.Time
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil && info.ModTime().After(newest) {
			newest = info.ModTime()
		}
		return err
	})
	return newest, err
}

// NoScriptsUser is the ACL user AddNoScriptsUser creates, and
// NoScriptsPassword its password.
const (
	NoScriptsUser     = "noscripts"
	NoScriptsPassword = "noscripts-pw"
)

// AddNoScriptsUser creates on r the ACL user NoScriptsUser, who may run
// every command but the scripting ones (+@all -@scripting) on every key
// and channel, as a deployment that denies Lua does.
func (r *Redis) AddNoScriptsUser(t TB) {
	t.Helper()
	if _, err := r.Do("ACL", "SETUSER", NoScriptsUser, "on", ">"+NoScriptsPassword, "~*", "&*", "+@all", "-@scripting"); err != nil {
		t.Fatalf("ACL SETUSER %s: %v", NoScriptsUser, err)
	}
}
