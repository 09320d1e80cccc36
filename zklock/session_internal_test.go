package zklock

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// sniff returns a sniffConn whose server sends reply, and its record.
func sniff(t *testing.T, reply []byte) (*sniffConn, *sessionInfo) {
	t.Helper()
	client, server := net.Pipe()
	t.Cleanup(func() { client.Close(); server.Close() })
	go func() { server.Write(reply); server.Close() }()
	s := &sessionInfo{}
	return &sniffConn{Conn: client, s: s, hsDeadline: time.Now().Add(time.Minute)}, s
}

// connectReply is a connect reply of the given fields, with a 16-byte
// password of pwlen claimed length and, when ro, the read-only flag.
func connectReply(ms int32, sid int64, pwlen uint32, ro bool) []byte {
	b := binary.BigEndian.AppendUint32(nil, 0) // length, set below
	b = binary.BigEndian.AppendUint32(b, 0)    // protocol version
	b = binary.BigEndian.AppendUint32(b, uint32(ms))
	b = binary.BigEndian.AppendUint64(b, uint64(sid))
	b = binary.BigEndian.AppendUint32(b, pwlen)
	b = append(b, make([]byte, 16)...)
	if ro {
		b = append(b, 0)
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// An HTTP server's reply fails the client's read of the 4-byte length
// prefix itself, so the client never sees "HTTP" as a length.
// Symptom: go-zookeeper allocated a 1.2 GB buffer for it on every reconnect attempt.
func TestSniffConn_RefusesLengthPrefixBeforeTheClientReadsIt(t *testing.T) {
	sc, s := sniff(t, []byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
	buf := make([]byte, 4) // what go-zookeeper reads first
	n, err := io.ReadFull(sc, buf)
	if err == nil || n != 0 {
		t.Fatalf("read of the length prefix = %d bytes %q, %v; want 0 bytes and an error", n, buf[:n], err)
	}
	if s.lastErr == nil {
		t.Fatal("the refusal was not recorded for Connect's error")
	}
}

// A reply claiming a password longer than 16 bytes is refused before the
// client reads it, an expired session's reply too.
// Symptom: go-zookeeper allocated the claimed length, 2 GB here, on every attempt.
func TestSniffConn_RefusesAPasswordLengthOtherThan16(t *testing.T) {
	for _, sid := range []int64{0, 7} { // expired, live
		sc, s := sniff(t, connectReply(0, sid, 0x7fffffff, false))
		buf := make([]byte, 40)
		if _, err := io.ReadFull(sc, buf[:4]); err != nil {
			t.Fatalf("session %d: length prefix: %v", sid, err)
		}
		if n, err := io.ReadFull(sc, buf[4:]); err == nil || n != 0 {
			t.Fatalf("session %d: read of the reply = %d bytes, %v; want 0 bytes and an error", sid, n, err)
		}
		if s.lastErr == nil {
			t.Fatalf("session %d: the refusal was not recorded", sid)
		}
	}
}

// A well-formed connect reply (36 bytes, 37 with the read-only flag, or
// an expired session's) passes through whole, however the client splits
// its reads, and records the granted timeout of a live session.
func TestSniffConn_PassesConnectReplies(t *testing.T) {
	for _, c := range []struct {
		name  string
		reply []byte
		ms    int64
	}{
		{"live", connectReply(6000, 7, 16, false), 6000},
		{"read-only flag", connectReply(6000, 7, 16, true), 6000},
		{"expired", connectReply(0, 0, 16, false), 0},
	} {
		for _, first := range []int{1, 3, 4, 5, 23, 24, len(c.reply)} {
			sc, s := sniff(t, c.reply)
			got := make([]byte, len(c.reply))
			if _, err := io.ReadFull(sc, got[:first]); err != nil {
				t.Fatalf("%s: first read of %d bytes: %v", c.name, first, err)
			}
			if _, err := io.ReadFull(sc, got[first:]); err != nil {
				t.Fatalf("%s: rest after %d bytes: %v", c.name, first, err)
			}
			if string(got) != string(c.reply) {
				t.Fatalf("%s: reads split at %d passed %v, want %v", c.name, first, got, c.reply)
			}
			if ms := s.ms.Load(); ms != c.ms {
				t.Fatalf("%s: reads split at %d recorded a %dms timeout, want %d", c.name, first, ms, c.ms)
			}
		}
	}
}
