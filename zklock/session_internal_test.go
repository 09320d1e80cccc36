package zklock

import (
	"io"
	"net"
	"testing"
	"time"
)

// An HTTP server's reply fails the client's read of the 4-byte length
// prefix itself, so the client never sees "HTTP" as a length. (go-zookeeper
// allocated a 1.2 GB buffer for it on every reconnect attempt.)
func TestSniffConn_RefusesLengthPrefixBeforeTheClientReadsIt(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	go func() {
		io.WriteString(server, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
		server.Close()
	}()
	s := &sessionInfo{}
	sc := &sniffConn{Conn: client, s: s, hsDeadline: time.Now().Add(time.Minute)}
	buf := make([]byte, 4) // what go-zookeeper reads first
	n, err := io.ReadFull(sc, buf)
	if err == nil || n != 0 {
		t.Fatalf("read of the length prefix = %d bytes %q, %v; want 0 bytes and an error", n, buf[:n], err)
	}
	if s.lastErr == nil {
		t.Fatal("the refusal was not recorded for Connect's error")
	}
}

// A well-formed connect reply passes through whole, however the client
// splits its reads, and records the granted timeout.
func TestSniffConn_PassesAConnectReply(t *testing.T) {
	reply := []byte{
		0, 0, 0, 36, // length
		0, 0, 0, 0, // protocol version
		0, 0, 0x17, 0x70, // timeout 6000 ms
		0, 0, 0, 0, 0, 0, 0, 7, // session id
		0, 0, 0, 16, // password length
		1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, // password
	}
	for _, first := range []int{1, 3, 4, 5, 24, len(reply)} {
		client, server := net.Pipe()
		go func() { server.Write(reply); server.Close() }()
		s := &sessionInfo{}
		sc := &sniffConn{Conn: client, s: s, hsDeadline: time.Now().Add(time.Minute)}
		got := make([]byte, len(reply))
		if _, err := io.ReadFull(sc, got[:first]); err != nil {
			t.Fatalf("first read of %d bytes: %v", first, err)
		}
		if _, err := io.ReadFull(sc, got[first:]); err != nil {
			t.Fatalf("rest after %d bytes: %v", first, err)
		}
		if string(got) != string(reply) {
			t.Fatalf("reads split at %d passed %v, want %v", first, got, reply)
		}
		if ms := s.ms.Load(); ms != 6000 {
			t.Fatalf("reads split at %d recorded a %dms timeout, want 6000", first, ms)
		}
		client.Close()
	}
}
