package redisproto_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// TestSubscriptionClose_ReturnsWhileLinkStalled: closing subscriptions
// never waits on the link: here the hub's pub/sub connection is
// reconnecting through a stalled link, which holds go-redis's PubSub mutex
// for the read timeout of the handshake. The client's timeouts outlast
// the hang bound, so a Close that waited on the link would hang until the
// link heals, at cleanup.
func TestSubscriptionClose_ReturnsWhileLinkStalled(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	t.Cleanup(p.Heal) // before the proxy stops, so the background work ends
	n := redisproto.NewNode(patientClient(t, p.Addr()), "dlock")
	k := key(t)
	a, err := n.Watch(dlocktest.Context(t), k, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.Watch(dlocktest.Context(t), k, "b")
	if err != nil {
		t.Fatal(err)
	}
	p.Cut() // the reader's connection dies; reconnecting is refused
	time.Sleep(200 * time.Millisecond)
	p.Heal()
	p.Stall() // the next reconnection hangs in its handshake
	time.Sleep(300 * time.Millisecond)
	for _, s := range []*redisproto.Subscription{a, b} {
		done := make(chan struct{})
		start := time.Now()
		go func() { s.Close(); close(done) }()
		select {
		case <-done:
			t.Logf("Close returned after %v", time.Since(start).Round(10*time.Microsecond))
		case <-time.After(dlocktest.HangTimeout):
			t.Fatalf("hang: Close waited on a stalled link (%v so far)", dlocktest.HangTimeout)
		}
	}
}

// Waits that end before their SUBSCRIBE was confirmed leave nothing
// subscribed: the hub sends each channel's SUBSCRIBE and UNSUBSCRIBE in
// order, and a subscription that outlives them still hears its releases.
// Here the requests pile up behind a reconnection through a stalled link.
// (TestWatch_EndedWaits_LeaveNothingSubscribed in redislock checks the
// same through a Locker, with many short waits.)
func TestHubUnsubscribesEndedWaits(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	t.Cleanup(p.Heal)
	n := redisproto.NewNode(newClient(t, p.Addr()), "dlock")
	admin := newClient(t, srv.Addr())
	k := key(t)
	keeper, err := n.Watch(dlocktest.Context(t), k, "keeper")
	if err != nil {
		t.Fatal(err)
	}
	defer keeper.Close()
	p.Cut() // the reader's connection dies; reconnecting is refused
	time.Sleep(200 * time.Millisecond)
	p.Heal()
	p.Stall() // the next reconnection hangs in its handshake
	time.Sleep(200 * time.Millisecond)
	for i := range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		if s, err := n.Watch(ctx, k, fmt.Sprint("w", i)); err == nil {
			s.Close() // unconfirmed (the confirmation bound is longer)
		}
		cancel()
	}
	p.Heal()
	want := []string{n.WaiterChannel(k, "keeper")}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		chans, err := admin.PubSubChannels(dlocktest.Context(t), n.WaiterChannel(k, "*")).Result()
		if err == nil && slices.Equal(chans, want) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("subscribed channels: %q (%v), want %q", chans, err, want)
		}
	}
	if err := admin.Publish(dlocktest.Context(t), want[0], "1").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-keeper.C():
	case <-time.After(30 * time.Second):
		t.Fatal("hang: the remaining subscription did not hear its channel")
	}
}

// Watch returns within its confirmation bound even when the link stalls
// before the pub/sub connection is made: the waiter then relies on polling.
func TestWatchOnStalledLink(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	t.Cleanup(p.Heal)
	n := redisproto.NewNode(newClient(t, p.Addr()), "dlock")
	p.Stall()
	done := make(chan error, 1)
	start := time.Now()
	var s *redisproto.Subscription
	go func() {
		var err error
		s, err = n.Watch(context.Background(), key(t), "w")
		done <- err
	}()
	select {
	case err := <-done:
		t.Logf("Watch returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
		if err != nil {
			t.Fatalf("Watch on a stalled link: %v, want an unconfirmed subscription", err)
		}
		s.Close()
	case <-time.After(30 * time.Second):
		t.Fatal("hang: Watch on a stalled link")
	}
}
