package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/grpclog"
)

var (
	logsMu   sync.Mutex
	logsDone bool
)

// setClientLogs silences go-redis's and etcd's (gRPC's) own loggers, or
// with --verbose routes them to o.logs with secrets scrubbed. (etcd's zap
// logger and go-zookeeper's are per client: etcdLogger, newZKLogger.)
func setClientLogs(o openOptions, secrets []string) {
	logsMu.Lock()
	defer logsMu.Unlock()
	if logsDone {
		return
	}
	logsDone = true
	if !o.verbose || o.logs == nil {
		redis.SetLogger(discardLogger{})
		grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, io.Discard))
		return
	}
	w := &scrubWriter{w: o.logs, secrets: secrets}
	redis.SetLogger(redisLogger{w})
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, w, w))
}

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

type redisLogger struct{ w io.Writer }

func (l redisLogger) Printf(_ context.Context, format string, args ...any) {
	fmt.Fprintf(l.w, "redis: "+strings.TrimSuffix(format, "\n")+"\n", args...)
}

// etcdLogger is the etcd client's zap logger: none, or warnings to logs.
func etcdLogger(o openOptions, secrets []string) *zap.Logger {
	if !o.verbose || o.logs == nil {
		return zap.NewNop()
	}
	enc := zap.NewDevelopmentEncoderConfig()
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(&scrubWriter{w: o.logs, secrets: secrets}), zapcore.InfoLevel)
	return zap.New(core).Named("etcd-client")
}

// zkLogger is a go-zookeeper connection's logger: silent, or with
// --verbose "zookeeper: ..." lines to logs, secrets scrubbed. It also keeps
// the client's last failure to connect, which Connect does not return, for
// the error when no session came.
type zkLogger struct {
	w io.Writer // nil: silent

	mu          sync.Mutex
	lastFailure string
}

func newZKLogger(o openOptions, secrets []string) *zkLogger {
	l := &zkLogger{}
	if o.verbose && o.logs != nil {
		l.w = &scrubWriter{w: o.logs, secrets: secrets}
	}
	return l
}

func (l *zkLogger) Printf(format string, args ...any) {
	msg := strings.TrimSuffix(fmt.Sprintf(format, args...), "\n")
	if strings.HasPrefix(format, "failed to connect to ") {
		l.mu.Lock()
		l.lastFailure = msg
		l.mu.Unlock()
	}
	if l.w != nil {
		fmt.Fprintf(l.w, "zookeeper: %s\n", msg)
	}
}

func (l *zkLogger) last() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastFailure
}

// scrubWriter removes secrets from everything written through it, and
// escapes control characters other than newline and tab (text from the
// lock service, such as a holder's metadata inside an error, must not
// drive the terminal). Each Write is scrubbed on its own: callers write
// whole lines.
type scrubWriter struct {
	mu      sync.Mutex
	w       io.Writer
	secrets []string
}

func (s *scrubWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := io.WriteString(s.w, escapeControls(scrub(string(p), s.secrets))); err != nil {
		return 0, err
	}
	return len(p), nil
}
