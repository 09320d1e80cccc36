package main

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
)

// Keys, owners and metadata are text that anybody with access to the lock
// service chose. Printed verbatim, a newline forges a line of output and
// an escape sequence (ESC [ ...) takes over the terminal. Human-readable
// output escapes them; JSON output stays exact.

// quoteField returns s as it is when it prints as one unambiguous field of
// a table (printable, no space, quote or backslash), else strconv.Quote(s).
func quoteField(s string) string {
	for i, r := range s {
		if r == ' ' || r == '"' || r == '\\' || !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return strconv.Quote(s) // invalid UTF-8
			}
		}
	}
	return s
}

// oneLine escapes, Go-style, every character of s that is not printable,
// newlines and tabs included, for a fragment of a one-line message.
func oneLine(s string) string { return escapeText(s, false) }

// escapeControls escapes what is not printable in s, but keeps newlines
// and tabs: for whole messages, which may span lines.
func escapeControls(s string) string { return escapeText(s, true) }

func escapeText(s string, keepLines bool) string {
	clean := true
	for _, r := range s {
		if !printable(r, keepLines) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case printable(r, keepLines):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\n', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

func printable(r rune, keepLines bool) bool {
	if r == utf8.RuneError {
		return false // an invalid byte, or U+FFFD itself: escaped either way
	}
	return strconv.IsPrint(r) || keepLines && (r == '\n' || r == '\t')
}

// holderText is dlock.HolderString with control characters escaped.
func holderText(owner string, md map[string]string) string {
	return oneLine(dlock.HolderString(owner, md))
}
