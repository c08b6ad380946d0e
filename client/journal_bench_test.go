package client

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quillhq/quill/contract"
)

// BenchmarkJournalCreateNote measures the journal's work in one MCP
// create_note without a key — the check for an unsettled operation with
// equal parameters (Unsettled), the Begin of the claim, the client's own
// Begin and the Settle — over a journal that already holds n settled
// operations.
func BenchmarkJournalCreateNote(b *testing.B) {
	for _, n := range []int{0, 1000, 10000} {
		b.Run(fmt.Sprintf("settled=%d", n), func(b *testing.B) {
			ctx := testContext(b)
			j, err := OpenFileJournal(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			seedSettled(b, j, n)
			params := json.RawMessage(`{"title":"benchmark","body":"a note of a few words"}`)
			at := time.Now().UTC()
			b.ResetTimer()
			for i := range b.N {
				key := fmt.Sprintf("bench-%d", i)
				if _, err := j.Unsettled(ctx); err != nil {
					b.Fatal(err)
				}
				e := JournalEntry{Key: key, Action: contract.ActionCreateNote, Params: params, CreatedAt: at}
				for range 2 {
					if _, err := j.Begin(ctx, e); err != nil {
						b.Fatal(err)
					}
				}
				if err := j.Settle(ctx, key, Settlement{State: StateCompleted, Status: 201, Body: json.RawMessage(`{"id":"x"}`), At: at}); err != nil {
					b.Fatal(err)
				}
				// Leave the journal as it was: n settled operations.
				b.StopTimer()
				forget(b, j, key)
				b.StartTimer()
			}
		})
	}
}

// seedSettled writes n settled records where j keeps them, without the
// fsyncs of Settle (a benchmark's setup, not a journal's write).
func seedSettled(b *testing.B, j *FileJournal, n int) {
	b.Helper()
	at := time.Now().UTC().Add(-time.Hour)
	for i := range n {
		e := JournalEntry{Key: fmt.Sprintf("seed-%d", i), Action: contract.ActionCreateNote,
			Params: json.RawMessage(fmt.Sprintf(`{"title":"seeded note %d","body":"some words of a body"}`, i)), CreatedAt: at,
			Settled: &Settlement{State: StateCompleted, Status: 201, Body: json.RawMessage(`{"id":"x"}`), At: at}}
		rec, err := MarshalRecord(e)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(j.settledPath(e.Key), rec, 0o600); err != nil {
			b.Fatal(err)
		}
	}
}

// forget removes key's record wherever the journal keeps it.
func forget(b *testing.B, j *FileJournal, key string) {
	b.Helper()
	p := j.path(key)
	for _, f := range []string{p, filepath.Join(j.dir, "settled", filepath.Base(p))} {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			b.Fatal(err)
		}
	}
}
