package redisproto

import (
	"embed"
	"fmt"
	"regexp"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The scripts are the files in lua/, embedded. Each starts with a comment
// header giving its KEYS, ARGV and return values. helpers.lua holds the
// functions they share; it is not a script.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// helpersFile is the file of shared functions in lua/.
const helpersFile = "helpers.lua"

// scripts is every script the package runs, by file name without ".lua"
// (the tests load each on a server).
var scripts = map[string]*redis.Script{}

// script returns the script of lua/<name>.lua, linked with the helpers it
// calls (see link), and registers it in scripts. A missing file or a
// script that does not link is a programming error: it panics at package
// initialisation.
func script(name string) *redis.Script {
	src, err := luaFiles.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic("redisproto: " + err.Error())
	}
	linked, err := link(string(src), luaDefs)
	if err != nil {
		panic(fmt.Sprintf("redisproto: lua/%s.lua: %v", name, err))
	}
	s := redis.NewScript(linked)
	scripts[name] = s
	return s
}

// luaDef is one definition a script may use: a constant or a helper
// function, as one line of Lua without comments.
type luaDef struct {
	name string
	code string // flattened: no newline, no comment
	bare string // code with its string literals emptied, to find the names it uses
}

// luaDefs are the definitions scripts are linked with: the constants, then
// the helpers of helpers.lua in file order.
var luaDefs = mustDefs()

func mustDefs() []luaDef {
	src, err := luaFiles.ReadFile("lua/" + helpersFile)
	if err != nil {
		panic("redisproto: " + err.Error())
	}
	defs, err := parseHelpers(luaConstants(), string(src))
	if err != nil {
		panic("redisproto: lua/" + helpersFile + ": " + err.Error())
	}
	return defs
}

// luaConstants are the Go constants the Lua code names, defined as locals
// in front of the helpers and scripts that use them.
func luaConstants() []luaDef {
	var defs []luaDef
	for _, c := range []struct {
		name  string
		value int64
	}{
		{"RECEIPTS", Receipts},
		{"RECEIPT_RETENTION_MS", Ms(ReceiptRetention)},
		{"HANDED_ON", HandedOn},
	} {
		code := fmt.Sprintf("local %s = %d", c.name, c.value)
		defs = append(defs, luaDef{name: c.name, code: code, bare: code})
	}
	return defs
}

// helperStart matches the first line of a helper in helpers.lua.
var helperStart = regexp.MustCompile(`^local function ([A-Za-z_][A-Za-z0-9_]*)\(`)

// parseHelpers splits src (helpers.lua) into its helpers, each a top-level
// "local function NAME(" block that runs up to the next one, and returns
// consts followed by the helpers, flattened. A helper may name only the
// constants and the helpers defined above it: a local function is not
// visible above its definition, so a call to one below would be a call to
// an undefined global.
func parseHelpers(consts []luaDef, src string) ([]luaDef, error) {
	code, err := stripLua(src, false)
	if err != nil {
		return nil, err
	}
	bare, err := stripLua(src, true)
	if err != nil {
		return nil, err
	}
	lines, bareLines := strings.Split(code, "\n"), strings.Split(bare, "\n")
	defs := append([]luaDef(nil), consts...)
	start := -1
	flush := func(end int) error {
		if start < 0 {
			return nil
		}
		c, err := joinLines(lines[start:end], start+1)
		if err != nil {
			return err
		}
		b, _ := joinLines(bareLines[start:end], start+1)
		defs = append(defs, luaDef{name: helperStart.FindStringSubmatch(lines[start])[1], code: c, bare: b})
		return nil
	}
	for i, l := range lines {
		if helperStart.MatchString(l) {
			if err := flush(i); err != nil {
				return nil, err
			}
			start = i
			continue
		}
		if start < 0 && strings.TrimSpace(l) != "" {
			return nil, fmt.Errorf("line %d: code outside a helper", i+1)
		}
	}
	if err := flush(len(lines)); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i, d := range defs {
		if seen[d.name] {
			return nil, fmt.Errorf("%s is defined twice", d.name)
		}
		seen[d.name] = true
		for _, later := range defs[i+1:] {
			if names(d.bare, later.name) {
				return nil, fmt.Errorf("%s uses %s, which is defined below it", d.name, later.name)
			}
		}
	}
	return defs, nil
}

// link returns src with the definitions it uses (directly or through
// other definitions) in front of its first line, on that line: the result
// has as many lines as src, each line after the first unchanged, so the
// line numbers Redis reports are src's. An error raised inside a helper
// is reported on line 1.
func link(src string, defs []luaDef) (string, error) {
	if strings.HasPrefix(src, "#!") {
		return "", fmt.Errorf("a shebang must stay on line 1; the helpers go there")
	}
	bare, err := stripLua(src, true)
	if err != nil {
		return "", err
	}
	// A definition uses only those above it, so a pass from the last up
	// finds every one needed.
	need := make([]bool, len(defs))
	for i := len(defs) - 1; i >= 0; i-- {
		need[i] = names(bare, defs[i].name)
		for j := i + 1; j < len(defs) && !need[i]; j++ {
			need[i] = need[j] && names(defs[j].bare, defs[i].name)
		}
	}
	var sb strings.Builder
	for i, d := range defs {
		if need[i] {
			sb.WriteString(d.code)
			sb.WriteByte(' ')
		}
	}
	return sb.String() + src, nil
}

// names reports whether Lua code (comments and strings removed) uses the
// name as a variable, not as a field ("x.name", "x:name").
func names(code, name string) bool {
	for i := 0; ; {
		j := strings.Index(code[i:], name)
		if j < 0 {
			return false
		}
		j += i
		end := j + len(name)
		if (j == 0 || !isIdent(code[j-1]) && code[j-1] != '.' && code[j-1] != ':') &&
			(end == len(code) || !isIdent(code[end])) {
			return true
		}
		i = j + 1
	}
}

func isIdent(c byte) bool {
	return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// joinLines joins lines of Lua without comments into one line. first is
// the number of lines[0] in its file, for errors. A line starting with '('
// is refused: after a newline Lua reads it as a new statement (or refuses
// it as ambiguous), on one line as a call of what precedes it.
func joinLines(lines []string, first int) (string, error) {
	var parts []string
	for i, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		if strings.HasPrefix(l, "(") && len(parts) > 0 {
			return "", fmt.Errorf("line %d starts with '(': joined to the line above it, it would call it", first+i)
		}
		parts = append(parts, l)
	}
	return strings.Join(parts, " "), nil
}

// stripLua returns Lua source without its comments, newlines kept, and
// with its string literals emptied (the quotes kept) when blankStrings is
// set. It refuses what it does not parse: long
// comments and long strings ("--[[", "[[", "[=["), and a newline in a
// quoted string.
func stripLua(src string, blankStrings bool) (string, error) {
	var sb strings.Builder
	line := 1
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '\n':
			line++
			sb.WriteByte(c)
		case c == '-' && strings.HasPrefix(src[i:], "--"):
			if longBracket(src[i+2:]) {
				return "", fmt.Errorf("line %d: long comments are not supported", line)
			}
			for i+1 < len(src) && src[i+1] != '\n' {
				i++
			}
		case c == '[' && longBracket(src[i:]):
			return "", fmt.Errorf("line %d: long strings are not supported", line)
		case c == '\'' || c == '"':
			sb.WriteByte(c)
			for i++; ; i++ {
				if i == len(src) || src[i] == '\n' {
					return "", fmt.Errorf("line %d: unfinished string", line)
				}
				if src[i] == c {
					break
				}
				if src[i] == '\\' && i+1 < len(src) {
					if src[i+1] == '\n' {
						return "", fmt.Errorf("line %d: a string continued on the next line", line)
					}
					if !blankStrings {
						sb.WriteByte(src[i])
					}
					i++
				}
				if !blankStrings {
					sb.WriteByte(src[i])
				}
			}
			sb.WriteByte(c)
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String(), nil
}

// longBracket reports whether s starts with a Lua long bracket, "[[" or
// "[=...=[".
func longBracket(s string) bool {
	if !strings.HasPrefix(s, "[") {
		return false
	}
	s = strings.TrimLeft(s[1:], "=")
	return strings.HasPrefix(s, "[")
}
