package idempotency_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/idempotency"
)

// released reports whether ch is closed, without blocking.
func released(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitClosed fails the test unless ch is closed within a generous deadline.
func waitClosed(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal(msg)
	}
}

func TestFlightsLeaderAndFollower(t *testing.T) {
	t.Parallel()
	f := idempotency.NewFlights()

	_, ok := f.Executing(1)
	require.False(t, ok, "nothing executes before anyone joined")

	wait, leave := f.Join(1, "create-note")
	require.Nil(t, wait, "the first to join leads")
	require.NotNil(t, leave)

	action, ok := f.Executing(1)
	require.True(t, ok)
	require.Equal(t, "create-note", action)

	fwait, fleave := f.Join(1, "create-note")
	require.NotNil(t, fwait, "a second joiner follows")
	require.Nil(t, fleave, "a follower has nothing to leave")
	require.False(t, released(fwait), "a follower waits while the leader is in the flight")

	// A follower for another action does not change what is executing.
	owait, oleave := f.Join(1, "delete-note")
	require.NotNil(t, owait)
	require.Nil(t, oleave)
	action, ok = f.Executing(1)
	require.True(t, ok)
	require.Equal(t, "create-note", action)

	leave()
	require.True(t, released(fwait), "followers are released when the leader leaves")
	require.True(t, released(owait))
	_, ok = f.Executing(1)
	require.False(t, ok, "nothing executes after the leader left")

	// The next joiner leads a new flight.
	wait, leave = f.Join(1, "delete-note")
	require.Nil(t, wait)
	require.NotNil(t, leave)
	action, ok = f.Executing(1)
	require.True(t, ok)
	require.Equal(t, "delete-note", action)
	leave()
}

func TestFlightsAreIndependentPerOperation(t *testing.T) {
	t.Parallel()
	f := idempotency.NewFlights()

	wait1, leave1 := f.Join(1, "create-note")
	require.Nil(t, wait1)
	wait2, leave2 := f.Join(2, "delete-note")
	require.Nil(t, wait2, "another operation has its own leader")

	follow1, _ := f.Join(1, "create-note")
	follow2, _ := f.Join(2, "delete-note")

	a1, ok1 := f.Executing(1)
	a2, ok2 := f.Executing(2)
	require.True(t, ok1)
	require.True(t, ok2)
	require.Equal(t, "create-note", a1)
	require.Equal(t, "delete-note", a2)

	leave2()
	require.True(t, released(follow2))
	require.False(t, released(follow1), "leaving one flight does not release another")
	_, ok := f.Executing(2)
	require.False(t, ok)
	_, ok = f.Executing(1)
	require.True(t, ok)

	leave1()
	require.True(t, released(follow1))

	// Separate Flights values share nothing.
	g := idempotency.NewFlights()
	wait, leave := g.Join(1, "create-note")
	require.Nil(t, wait)
	leave()
}

func TestFlightsConcurrentJoinersHaveExactlyOneLeader(t *testing.T) {
	t.Parallel()
	const n = 100
	f := idempotency.NewFlights()

	var (
		leaders   atomic.Int32
		followers atomic.Int32
		joined    sync.WaitGroup // every goroutine has called Join
		done      sync.WaitGroup // every goroutine has returned
	)
	start := make(chan struct{})
	joined.Add(n)
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			<-start
			wait, leave := f.Join(42, "create-note")
			joined.Done()
			if leave != nil {
				leaders.Add(1)
				// Lead until everyone joined, so that no late joiner can
				// legitimately start a second flight.
				joined.Wait()
				leave()
				return
			}
			followers.Add(1)
			<-wait
		}()
	}
	close(start)

	all := make(chan struct{})
	go func() {
		done.Wait()
		close(all)
	}()
	waitClosed(t, all, "followers were not released when the leader left")

	require.Equal(t, int32(1), leaders.Load())
	require.Equal(t, int32(n-1), followers.Load())
	_, ok := f.Executing(42)
	require.False(t, ok)
}

func TestFlightsFollowersReleasedOnlyWhenLeaderLeaves(t *testing.T) {
	t.Parallel()
	const n = 50
	f := idempotency.NewFlights()
	wait, leave := f.Join(7, "create-note")
	require.Nil(t, wait)

	var out sync.WaitGroup
	releasedCount := atomic.Int32{}
	waits := make([]<-chan struct{}, n)
	for i := range n {
		w, l := f.Join(7, "create-note")
		require.NotNil(t, w)
		require.Nil(t, l)
		waits[i] = w
	}
	out.Add(n)
	for i := range n {
		go func() {
			defer out.Done()
			<-waits[i]
			releasedCount.Add(1)
		}()
	}
	for _, w := range waits {
		require.False(t, released(w))
	}
	require.Equal(t, int32(0), releasedCount.Load())

	leave()

	all := make(chan struct{})
	go func() {
		out.Wait()
		close(all)
	}()
	waitClosed(t, all, "not every follower was released")
	require.Equal(t, int32(n), releasedCount.Load())
}

// A released follower that joins again (the retry after reading the
// outcome) either leads or follows a live leader; the flight never wedges.
func TestFlightsRejoinAfterRelease(t *testing.T) {
	t.Parallel()
	const n = 20
	f := idempotency.NewFlights()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		leading int
		maxLead int
		notExec atomic.Int32
	)
	wg.Add(n)
	for range n {
		go func() {
			defer wg.Done()
			for {
				wait, leave := f.Join(9, "create-note")
				if leave != nil {
					mu.Lock()
					leading++
					maxLead = max(maxLead, leading)
					mu.Unlock()
					action, ok := f.Executing(9)
					if !ok || action != "create-note" {
						notExec.Add(1)
					}
					mu.Lock()
					leading--
					mu.Unlock()
					leave()
					return
				}
				<-wait
			}
		}()
	}
	all := make(chan struct{})
	go func() {
		wg.Wait()
		close(all)
	}()
	waitClosed(t, all, "joiners wedged")
	require.Equal(t, 1, maxLead, "two leaders at once")
	require.Zero(t, notExec.Load(), "a leader's flight was not reported as executing")
	_, ok := f.Executing(9)
	require.False(t, ok)
}
