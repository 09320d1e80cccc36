package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// urlWithheldEnv is set in the environment of a dlock run's CMD when the
// DLOCK_URL it would have inherited held a secret and was left out: a
// dlock started by CMD must then be given its URL, not fall back to the
// local file backend (a different lock service) without a word.
const urlWithheldEnv = "DLOCK_URL_WITHHELD"

// urlWithheld is what defaultURL returns under urlWithheldEnv: parseURL
// refuses it with errURLWithheld's explanation.
const urlWithheld = "withheld:"

// defaultURL is $DLOCK_URL or a file backend in the per-user state dir.
func defaultURL() string {
	if u := os.Getenv("DLOCK_URL"); u != "" {
		return u
	}
	if os.Getenv(urlWithheldEnv) != "" {
		return urlWithheld
	}
	return "file://" + stateDir()
}

// stateDir is $XDG_STATE_HOME/dlock, ~/.local/state/dlock, or a per-user
// directory under the system temp dir.
func stateDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "dlock")
	}
	if h, err := os.UserHomeDir(); err == nil && h != "" && h != "/" {
		return filepath.Join(h, ".local", "state", "dlock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("dlock-%d", os.Getuid()))
}

// urlHelp is --url's help.
const urlHelp = "lock service URL (default: $DLOCK_URL, else a file:// directory in your state directory; see 'dlock --help')"

// maxURLFile bounds what --url-file reads: a URL is one short line.
const maxURLFile = 64 << 10

// urlSource is a command's --url and --url-file: both write the URL to
// the same string, and check refuses both given.
type urlSource struct {
	url             *string
	urlSet, fileSet bool
}

// defineURL adds --url (help as given) and --url-file to o, both setting
// *p; call check after parsing.
func defineURL(o *optionSet, p *string, help string) *urlSource {
	s := &urlSource{url: p}
	o.Var(urlValue{s}, "", "url", "URL", help)
	o.Var(urlFileValue{s}, "", "url-file", "PATH", "read the URL from this file (surrounding white space trimmed), to keep a password out of argv and the environment")
	return s
}

// check refuses --url together with --url-file.
func (s *urlSource) check() error {
	if s.urlSet && s.fileSet {
		return errors.New("give either --url or --url-file, not both")
	}
	return nil
}

type urlValue struct{ s *urlSource }

func (v urlValue) Set(raw string) error {
	*v.s.url, v.s.urlSet = raw, true
	return nil
}

func (v urlValue) String() string { return "" } // may hold a password

type urlFileValue struct{ s *urlSource }

func (v urlFileValue) Set(path string) error {
	raw, err := readURLFile(path)
	if err != nil {
		return err
	}
	if !v.s.urlSet {
		*v.s.url = raw
	}
	v.s.fileSet = true
	return nil
}

func (v urlFileValue) String() string { return "" }

// readURLFile reads a URL from path: one line, white space around it
// trimmed. Its errors never quote the file's contents.
func readURLFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", errors.Unwrap(err) // the path is in the message already
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return "", errors.New("is a directory")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxURLFile+1))
	if err != nil {
		return "", errors.Unwrap(err)
	}
	raw := strings.TrimSpace(string(b))
	switch {
	case len(b) > maxURLFile:
		return "", fmt.Errorf("longer than %d bytes: want one URL", maxURLFile)
	case raw == "":
		return "", errors.New("holds no URL")
	case strings.ContainsAny(raw, "\r\n"):
		return "", errors.New("holds more than one line: want one URL")
	}
	return raw, nil
}
