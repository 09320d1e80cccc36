// Command releasecheck proves that dlock's modules can be installed by a
// user: it packs every module of the workspace (go.work) from the working
// tree into a file-based module proxy at a test version, then, with no
// go.work and no replace directive, resolves and builds a fresh consumer
// module that imports the core and every backend, and installs the CLI
// with `go install github.com/dlock-go/dlock/cmd/dlock@VERSION`.
//
// It fails when a module's go.mod has a replace directive or requires a
// sibling at a pseudo-version (users' builds ignore replaces, and nobody
// can fetch v0.0.0-00010101000000-000000000000), and when any step of the
// consumer's build fails. Third-party modules come from the usual GOPROXY.
//
// Usage (from the repository root; `make release-check` runs it):
//
//	go run ./internal/releasecheck [-keep]
package main

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

const root = "github.com/dlock-go/dlock"

// unpublished are the workspace's modules that test or show dlock and
// that no user imports: the benchmarks, the safety harness and the case
// studies (examples).
var unpublished = map[string]bool{root + "/bench": true, root + "/examples": true, root + "/safety": true}

type module struct {
	Path string // module path
	Dir  string // absolute directory
}

func main() {
	keep := flag.Bool("keep", false, "keep the proxy and consumer directories")
	flag.Parse()
	if err := run(*keep); err != nil {
		fmt.Fprintln(os.Stderr, "release-check: FAIL:", err)
		os.Exit(1)
	}
	fmt.Println("release-check: ok")
}

func run(keep bool) error {
	repo, err := os.Getwd()
	if err != nil {
		return err
	}
	mods, err := workspaceModules(repo)
	if err != nil {
		return err
	}
	// A fresh version every run: the module cache keeps what it downloaded
	// per version, so a reused version would test stale content.
	version := fmt.Sprintf("v0.0.0-rc.%d", time.Now().Unix())
	fmt.Printf("release-check: %d modules at %s\n", len(mods), version)

	tmp, err := os.MkdirTemp("", "dlock-releasecheck-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Println("release-check: keeping", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	proxy := filepath.Join(tmp, "proxy")
	var published []module
	for _, m := range mods {
		if !strings.HasPrefix(m.Path, root) || unpublished[m.Path] {
			continue
		}
		if err := checkGoMod(m, mods); err != nil {
			return err
		}
		if err := pack(proxy, m, mods, version); err != nil {
			return fmt.Errorf("packing %s: %w", m.Path, err)
		}
		published = append(published, m)
	}
	defer cleanModCache(published, version)

	consumer := filepath.Join(tmp, "consumer")
	if err := writeConsumer(consumer, published); err != nil {
		return err
	}
	env := consumerEnv(proxy, tmp)
	get := []string{"get"}
	for _, m := range published {
		get = append(get, m.Path+"@"+version)
	}
	steps := [][]string{
		{"mod", "init", "example.com/dlockconsumer"},
		get,
		{"mod", "tidy"},
		{"build", "./..."},
		{"vet", "./..."},
	}
	for _, s := range steps {
		if err := goCmd(consumer, env, s...); err != nil {
			return err
		}
	}
	gomod, err := os.ReadFile(filepath.Join(consumer, "go.mod"))
	if err != nil {
		return err
	}
	if bytes.Contains(gomod, []byte("replace")) {
		return errors.New("the consumer's go.mod has a replace directive")
	}
	bin := filepath.Join(tmp, "bin")
	if err := goCmd(tmp, append(env, "GOBIN="+bin), "install", root+"/cmd/dlock@"+version); err != nil {
		return err
	}
	out, err := exec.Command(filepath.Join(bin, "dlock"), "version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("installed dlock version: %v: %s", err, out)
	}
	fmt.Printf("release-check: go install ...cmd/dlock@%s: %s", version, out)
	return nil
}

// workspaceModules lists the modules of go.work.
func workspaceModules(repo string) ([]module, error) {
	cmd := exec.Command("go", "list", "-m", "-json")
	cmd.Dir = repo
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m: %w", err)
	}
	var mods []module
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var m module
		if err := dec.Decode(&m); err != nil {
			return nil, err
		}
		mods = append(mods, m)
	}
	sort.Slice(mods, func(i, j int) bool { return mods[i].Path < mods[j].Path })
	return mods, nil
}

var pseudo = regexp.MustCompile(`v0\.0\.0-\d{14}-[0-9a-f]{12}`)

// checkGoMod refuses what a published go.mod must not have.
func checkGoMod(m module, mods []module) error {
	data, err := os.ReadFile(filepath.Join(m.Dir, "go.mod"))
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "replace") {
			return fmt.Errorf("%s/go.mod:%d: replace directive (ignored in users' builds; go.work is for local development)", m.Dir, n)
		}
		for _, s := range mods {
			f := strings.Fields(line)
			if len(f) >= 2 && (f[0] == s.Path || (f[0] == "require" && len(f) >= 3 && f[1] == s.Path)) {
				v := f[len(f)-1]
				if f[0] == "require" {
					v = f[2]
				} else {
					v = f[1]
				}
				if pseudo.MatchString(v) && strings.HasPrefix(v, "v0.0.0-0001") {
					return fmt.Errorf("%s/go.mod:%d: requires %s at the zero pseudo-version %s", m.Dir, n, s.Path, v)
				}
			}
		}
	}
	return sc.Err()
}

// modFor is m's go.mod with every sibling requirement at version.
func modFor(m module, mods []module, version string) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(m.Dir, "go.mod"))
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(data), "\n")
	for i, line := range lines {
		f := strings.Fields(line)
		for _, s := range mods {
			switch {
			case len(f) >= 2 && f[0] == s.Path:
				lines[i] = strings.Replace(line, f[1], version, 1)
			case len(f) >= 3 && f[0] == "require" && f[1] == s.Path:
				lines[i] = strings.Replace(line, f[2], version, 1)
			}
		}
	}
	return []byte(strings.Join(lines, "\n")), nil
}

// pack writes m into the proxy at version: list, .info, .mod and .zip.
func pack(proxy string, m module, mods []module, version string) error {
	dir := filepath.Join(proxy, filepath.FromSlash(m.Path), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mod, err := modFor(m, mods, version)
	if err != nil {
		return err
	}
	info := fmt.Sprintf(`{"Version":%q,"Time":%q}`, version, time.Now().UTC().Format(time.RFC3339))
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": []byte(info),
		version + ".mod":  mod,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	files, err := moduleFiles(m, mods)
	if err != nil {
		return err
	}
	zf, err := os.Create(filepath.Join(dir, version+".zip"))
	if err != nil {
		return err
	}
	defer zf.Close()
	zw := zip.NewWriter(zf)
	prefix := m.Path + "@" + version + "/"
	for _, rel := range files {
		var data []byte
		if rel == "go.mod" {
			data = mod
		} else if data, err = os.ReadFile(filepath.Join(m.Dir, filepath.FromSlash(rel))); err != nil {
			return err
		}
		w, err := zw.Create(prefix + rel)
		if err != nil {
			return err
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
	}
	return zw.Close()
}

// moduleFiles lists the files of m as git knows them (tracked, or new and
// not ignored), without nested modules, relative and slash-separated.
func moduleFiles(m module, mods []module) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z")
	cmd.Dir = m.Dir
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", m.Dir, err)
	}
	var nested []string
	for _, o := range mods {
		if o.Dir != m.Dir && strings.HasPrefix(o.Dir, m.Dir+string(filepath.Separator)) {
			rel, _ := filepath.Rel(m.Dir, o.Dir)
			nested = append(nested, filepath.ToSlash(rel)+"/")
		}
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" {
			continue
		}
		skip := false
		for _, n := range nested {
			if strings.HasPrefix(f, n) {
				skip = true
			}
		}
		// A directory with a go.mod that is not in go.work is a module
		// of its own too: leave it out.
		for d := path.Dir(f); d != "." && !skip; d = path.Dir(d) {
			if _, err := os.Stat(filepath.Join(m.Dir, filepath.FromSlash(d), "go.mod")); err == nil {
				skip = true
			}
		}
		if st, err := os.Lstat(filepath.Join(m.Dir, filepath.FromSlash(f))); skip || err != nil || !st.Mode().IsRegular() {
			continue
		}
		files = append(files, f)
	}
	return files, nil
}

// writeConsumer writes a program that imports every published package
// that is not internal, a test or a main package.
func writeConsumer(dir string, mods []module) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var imports []string
	for _, m := range mods {
		cmd := exec.Command("go", "list", "-f", "{{if and (ne .Name \"main\") (not .Standard)}}{{.ImportPath}}{{end}}", "./...")
		cmd.Dir = m.Dir
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("go list in %s: %w", m.Dir, err)
		}
		for _, p := range strings.Fields(string(out)) {
			if strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal") {
				continue
			}
			imports = append(imports, p)
		}
	}
	sort.Strings(imports)
	var b strings.Builder
	b.WriteString("// Command dlockconsumer imports every public dlock package, as a user would.\npackage main\n\nimport (\n")
	for _, p := range imports {
		fmt.Fprintf(&b, "\t_ %q\n", p)
	}
	b.WriteString(")\n\nfunc main() {}\n")
	fmt.Printf("release-check: the consumer imports %d packages\n", len(imports))
	return os.WriteFile(filepath.Join(dir, "main.go"), []byte(b.String()), 0o644)
}

func consumerEnv(proxy, tmp string) []string {
	upstream := os.Getenv("GOPROXY")
	if upstream == "" {
		out, _ := exec.Command("go", "env", "GOPROXY").Output()
		upstream = strings.TrimSpace(string(out))
	}
	env := []string{
		"GOWORK=off",
		"GOFLAGS=-mod=mod",
		"GOPROXY=file://" + filepath.ToSlash(proxy) + "," + upstream,
		"GONOSUMDB=" + root,
		"GOPRIVATE=",
		"GONOPROXY=",
		"GOTOOLCHAIN=local",
		"GOPATH=" + gopath(),
	}
	return env
}

func gopath() string {
	out, _ := exec.Command("go", "env", "GOPATH").Output()
	return strings.TrimSpace(string(out))
}

func goCmd(dir string, env []string, args ...string) error {
	fmt.Printf("release-check: go %s\n", strings.Join(args, " "))
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// cleanModCache removes the test version from the module cache so that
// runs do not accumulate there.
func cleanModCache(mods []module, version string) {
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return
	}
	cache := strings.TrimSpace(string(out))
	for _, m := range mods {
		for _, p := range []string{
			filepath.Join(cache, filepath.FromSlash(m.Path)+"@"+version),
			filepath.Join(cache, "cache", "download", filepath.FromSlash(m.Path), "@v", version+".zip"),
			filepath.Join(cache, "cache", "download", filepath.FromSlash(m.Path), "@v", version+".mod"),
			filepath.Join(cache, "cache", "download", filepath.FromSlash(m.Path), "@v", version+".info"),
			filepath.Join(cache, "cache", "download", filepath.FromSlash(m.Path), "@v", version+".ziphash"),
			filepath.Join(cache, "cache", "download", filepath.FromSlash(m.Path), "@v", version+".lock"),
		} {
			_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					_ = os.Chmod(q, 0o755)
				}
				return nil
			})
			_ = os.RemoveAll(p)
		}
	}
}
