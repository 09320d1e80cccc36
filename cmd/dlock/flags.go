package main

// Options in the GNU style, for every dlock command
//
// dlock's commands read their options the way flock(1), etcdctl and the
// GNU tools do: a long name with two dashes and, for the common ones, a
// one-letter short name (-w 5, --wait 5, --wait=5, -w5; switches may be
// grouped: -sn). Options come before the operands; the first operand (or
// "--") ends them. A long name with one dash (-ttl 10s) is accepted too,
// as Go's flag package accepts it. The help lists each option once, short
// and long together:
//
//	-w, --wait DUR|SECS   give up after waiting this long ...
//
// and a usage error is one line naming the problem plus a pointer to
// --help, not the whole help:
//
//	dlock run: invalid value "NaN" for -w: want a duration (2m, 1.5s) or ...
//	Try 'dlock run --help' for more information.
//
// Use: o := newOptions("run", runUsage); o.Bool(&v, "n", "nonblock", ...);
// operands, code, ok := o.Parse(args, stdout, stderr); if !ok { return code }.
// Checks after parsing report with o.UsageError, for the same two lines.

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// optionSet is one command's options.
type optionSet struct {
	cmd     string // "run": messages start with "dlock run: "
	about   string // the help before the options: usage lines, description
	trailer string // the help after the options: exit status, examples
	opts    []*option
	long    map[string]*option
	short   map[byte]*option
}

// option is one option: its names, its value and its line of help.
type option struct {
	short byte   // 0: none
	long  string // "": none
	arg   string // the value's name in the help ("DUR"); "" for a switch
	help  string
	value flag.Value
}

// newOptions starts the options of `dlock cmd`; about is the help printed
// before the list of options (usage lines and a description).
func newOptions(cmd, about string) *optionSet {
	return &optionSet{cmd: cmd, about: about, long: map[string]*option{}, short: map[byte]*option{}}
}

// Trailer sets the help printed after the options.
func (s *optionSet) Trailer(text string) { s.trailer = text }

// Var defines an option whose value v parses; short is "" or one
// character, arg names the value in the help ("" for a switch, which v
// must then be, as a flag.Value with IsBoolFlag).
func (s *optionSet) Var(v flag.Value, short, long, arg, help string) {
	if len(short) > 1 || short == "-" || short == "=" || short == "" && long == "" {
		panic("dlock: bad option names " + short + "/" + long) // a programming error
	}
	o := &option{long: long, arg: arg, help: help, value: v}
	if short != "" {
		o.short = short[0]
		if s.short[o.short] != nil {
			panic("dlock: option -" + short + " defined twice")
		}
		s.short[o.short] = o
	}
	if long != "" {
		if s.long[long] != nil {
			panic("dlock: option --" + long + " defined twice")
		}
		s.long[long] = o
	}
	s.opts = append(s.opts, o)
}

// Bool defines a switch.
func (s *optionSet) Bool(p *bool, short, long, help string) {
	s.Var((*boolValue)(p), short, long, "", help)
}

// String defines an option with a text value.
func (s *optionSet) String(p *string, short, long, arg, help string) {
	s.Var((*stringValue)(p), short, long, arg, help)
}

// Duration defines an option with a duration value ("30s", "2m").
func (s *optionSet) Duration(p *time.Duration, short, long, arg, help string) {
	s.Var((*durationValue)(p), short, long, arg, help)
}

// Int defines an option with a whole-number value.
func (s *optionSet) Int(p *int, short, long, arg, help string) {
	s.Var((*intValue)(p), short, long, arg, help)
}

// Parse reads the options at the start of args and returns the operands
// after them ("--" ending the options is dropped). With ok false the
// command is over and code is its exit status: 0 after --help (printed
// on stdout), exitUsage after a usage error (one line and the pointer to
// --help, on stderr).
func (s *optionSet) Parse(args []string, stdout, stderr io.Writer) (operands []string, code int, ok bool) {
	if parseHook != nil {
		parseHook(s)
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return args[i+1:], 0, true
		}
		if a == "-" || !strings.HasPrefix(a, "-") {
			return args[i:], 0, true
		}
		next := func() (string, bool) { // the following argument, as a value
			if i+1 >= len(args) {
				return "", false
			}
			i++
			return args[i], true
		}
		if body, isLong := s.longForm(a); isLong {
			name, val, hasVal := strings.Cut(body, "=")
			o := s.long[name]
			if o == nil && name == "help" {
				s.PrintHelp(stdout)
				return nil, 0, false
			}
			if o == nil {
				return nil, s.UsageError(stderr, "option --%s is not defined", oneLine(name)), false
			}
			if !hasVal && !isSwitch(o.value) {
				if val, hasVal = next(); !hasVal {
					return nil, s.UsageError(stderr, "option --%s needs a value (%s)", name, o.arg), false
				}
			}
			if !hasVal {
				val = "true"
			}
			if err := o.value.Set(val); err != nil {
				return nil, s.UsageError(stderr, "%s", valueError(o, "--"+name, val, err)), false
			}
			continue
		}
		// A group of short options: -sn, -w5, -w 5, -w=5.
		for j := 1; j < len(a); j++ {
			c := a[j]
			o := s.short[c]
			if o == nil && c == 'h' {
				s.PrintHelp(stdout)
				return nil, 0, false
			}
			if o == nil && len(a) > 2 {
				return nil, s.UsageError(stderr, "option -%s is not defined (in %s; long options start with --)", oneLine(a[j:j+1]), strconv.Quote(a)), false
			}
			if o == nil {
				return nil, s.UsageError(stderr, "option -%s is not defined", oneLine(a[j:j+1])), false
			}
			if isSwitch(o.value) {
				if err := o.value.Set("true"); err != nil {
					return nil, s.UsageError(stderr, "%s", valueError(o, "-"+string(c), "true", err)), false
				}
				continue
			}
			val, hasVal := strings.TrimPrefix(a[j+1:], "="), j+1 < len(a)
			if !hasVal {
				if val, hasVal = next(); !hasVal {
					return nil, s.UsageError(stderr, "option -%c needs a value (%s)", c, o.arg), false
				}
			}
			if err := o.value.Set(val); err != nil {
				return nil, s.UsageError(stderr, "%s", valueError(o, "-"+string(c), val, err)), false
			}
			break
		}
	}
	return nil, 0, true
}

// parseHook, set by tests only, sees each command's options before they
// are parsed (to check that the help and the synopsis list them all).
var parseHook func(*optionSet)

// longForm returns what follows the dashes of a long option: "--name" or
// "--name=value", or "-name" when name is a long option of more than one
// letter (Go's flag syntax, still accepted).
func (s *optionSet) longForm(a string) (string, bool) {
	if strings.HasPrefix(a, "--") {
		return a[2:], true
	}
	name, _, _ := strings.Cut(a[1:], "=")
	if len(name) > 1 && (s.long[name] != nil || name == "help") {
		return a[1:], true
	}
	return "", false
}

func isSwitch(v flag.Value) bool {
	b, ok := v.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// valueError is the message for a value Set refused.
func valueError(o *option, name, val string, err error) string {
	if isSwitch(o.value) {
		return fmt.Sprintf("invalid boolean value %q for %s: want true or false", val, name)
	}
	return fmt.Sprintf("invalid value %q for %s: %s", val, name, oneLine(err.Error()))
}

// errText is err's text without the library's "dlock: " prefix, for a
// message that already starts with "dlock CMD: ".
func errText(err error) string {
	return strings.TrimPrefix(err.Error(), "dlock: ")
}

// UsageError prints "dlock CMD: PROBLEM" and the pointer to --help on
// stderr, and returns exitUsage.
func (s *optionSet) UsageError(stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "dlock %s: %s\n", s.cmd, fmt.Sprintf(format, args...))
	fmt.Fprintf(stderr, "Try 'dlock %s --help' for more information.\n", s.cmd)
	return exitUsage
}

// Help layout: option names in a column of at most helpColumn characters,
// descriptions wrapped to helpWidth.
const (
	helpColumn = 30
	helpWidth  = 79
)

// PrintHelp prints the whole help: about, the options (and -h, --help),
// then the trailer.
func (s *optionSet) PrintHelp(w io.Writer) {
	var b strings.Builder
	b.WriteString(s.about)
	if !strings.HasSuffix(s.about, "Options:\n") {
		b.WriteString("\nOptions:\n")
	}
	type line struct{ names, help string }
	var lines []line
	col := 0
	for _, o := range append(s.opts, s.helpOption()) {
		if o == nil {
			continue
		}
		names := "    "
		if o.short != 0 {
			names = "-" + string(o.short) + ", "
		}
		if o.long != "" {
			names += "--" + o.long
		} else {
			names = strings.TrimSuffix(names, ", ")
		}
		if o.arg != "" {
			names += " " + o.arg
		}
		names = "  " + names
		if len(names)+2 <= helpColumn {
			col = max(col, len(names)+2)
		}
		lines = append(lines, line{names, o.help})
	}
	for _, l := range lines {
		b.WriteString(l.names)
		pos := len(l.names)
		if pos+2 > col {
			b.WriteString("\n")
			pos = 0
		}
		b.WriteString(strings.Repeat(" ", col-pos))
		pos = col
		for i, word := range strings.Fields(l.help) {
			if i > 0 && pos+1+len(word) > helpWidth {
				b.WriteString("\n" + strings.Repeat(" ", col))
				pos = col
			} else if i > 0 {
				b.WriteString(" ")
				pos++
			}
			b.WriteString(word)
			pos += len(word)
		}
		b.WriteString("\n")
	}
	b.WriteString(s.trailer)
	io.WriteString(w, b.String())
}

// helpOption is the line for -h, --help, unless the command took those
// names for itself.
func (s *optionSet) helpOption() *option {
	o := &option{long: "help", help: "print this help and exit"}
	if s.long["help"] != nil {
		return nil
	}
	if s.short['h'] == nil {
		o.short = 'h'
	}
	return o
}

// The values of options.

type boolValue bool

func (b *boolValue) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*b = boolValue(v)
	return nil
}
func (b *boolValue) String() string   { return strconv.FormatBool(bool(*b)) }
func (b *boolValue) IsBoolFlag() bool { return true }

type stringValue string

func (v *stringValue) Set(s string) error { *v = stringValue(s); return nil }
func (v *stringValue) String() string     { return string(*v) }

type durationValue time.Duration

func (d *durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as 500ms, 30s or 2m")
	}
	*d = durationValue(v)
	return nil
}
func (d *durationValue) String() string { return time.Duration(*d).String() }

type intValue int

func (v *intValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("want a whole number")
	}
	*v = intValue(n)
	return nil
}
func (v *intValue) String() string { return strconv.Itoa(int(*v)) }
