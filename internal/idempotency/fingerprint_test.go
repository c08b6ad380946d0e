package idempotency_test

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/idempotency"
)

const (
	nfcE = "\u00e9"  // é, one code point
	nfdE = "e\u0301" // é, e + combining acute accent
)

func mustFingerprint(t *testing.T, action string, version int, p idempotency.Params) idempotency.Fingerprint {
	t.Helper()
	fp, err := idempotency.NewFingerprint(action, version, p)
	require.NoError(t, err)
	require.Len(t, fp.Sum, 32)
	return fp
}

// baseParams are create-note parameters as the notes package builds them.
func baseParams() idempotency.Params {
	return idempotency.Params{
		"title":      "Groceries",
		"body":       "milk",
		"attachment": nil,
	}
}

func TestFingerprintIgnoresMapOrder(t *testing.T) {
	t.Parallel()
	names := make([]string, 40)
	for i := range names {
		names[i] = "p" + strconv.Itoa(i)
	}
	build := func(order []string) idempotency.Params {
		p := idempotency.Params{}
		for _, n := range order {
			// Nested maps are built in the same order, so they too differ in
			// insertion order between runs.
			nested := map[string]any{}
			for _, m := range order {
				if slices.Contains(names[:8], m) {
					nested[m] = m + "-" + n
				}
			}
			p[n] = nested
		}
		return p
	}
	want := mustFingerprint(t, "create-note", 1, build(names))
	wantDoc, err := idempotency.CanonicalJSON("create-note", 1, build(names))
	require.NoError(t, err)
	for i := range 20 {
		order := slices.Clone(names)
		rand.New(rand.NewPCG(uint64(i), 7)).Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		got := mustFingerprint(t, "create-note", 1, build(order))
		require.Equal(t, want.Sum, got.Sum)
		require.Equal(t, want.Fields(), got.Fields())
		doc, err := idempotency.CanonicalJSON("create-note", 1, build(order))
		require.NoError(t, err)
		require.Equal(t, string(wantDoc), string(doc))
	}
}

func TestFingerprintNamesTheChangedParameter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(p idempotency.Params)
		want   []string
	}{
		{name: "title", change: func(p idempotency.Params) { p["title"] = "Groceries!" }, want: []string{"title"}},
		{name: "title trailing space", change: func(p idempotency.Params) { p["title"] = "Groceries " }, want: []string{"title"}},
		{name: "title case", change: func(p idempotency.Params) { p["title"] = "groceries" }, want: []string{"title"}},
		{name: "body", change: func(p idempotency.Params) { p["body"] = "eggs" }, want: []string{"body"}},
		{name: "body emptied", change: func(p idempotency.Params) { p["body"] = "" }, want: []string{"body"}},
		{name: "attachment added", change: func(p idempotency.Params) { p["attachment"] = map[string]any{"sha256": "00"} }, want: []string{"attachment"}},
		{name: "body type", change: func(p idempotency.Params) { p["body"] = 1 }, want: []string{"body"}},
		{name: "parameter removed", change: func(p idempotency.Params) { delete(p, "body") }, want: []string{"body"}},
		{name: "parameter added", change: func(p idempotency.Params) { p["pinned"] = true }, want: []string{"pinned"}},
		{name: "two parameters", change: func(p idempotency.Params) { p["title"] = "x"; p["body"] = "y" }, want: []string{"body", "title"}},
	}
	base := mustFingerprint(t, "create-note", 1, baseParams())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := baseParams()
			tt.change(p)
			fp := mustFingerprint(t, "create-note", 1, p)
			require.NotEqual(t, base.Sum, fp.Sum)
			require.Equal(t, tt.want, idempotency.DiffFields(base.Fields(), fp.Fields()))
			require.Equal(t, tt.want, idempotency.DiffFields(fp.Fields(), base.Fields()))
		})
	}
}

func TestFingerprintNestedChangeNamesTopLevelParameter(t *testing.T) {
	t.Parallel()
	p1 := baseParams()
	p1["attachment"] = map[string]any{"filename": "a.txt", "content_type": "text/plain", "sha256": "aa"}
	p2 := baseParams()
	p2["attachment"] = map[string]any{"filename": "a.txt", "content_type": "text/plain", "sha256": "ab"}
	f1 := mustFingerprint(t, "create-note", 1, p1)
	f2 := mustFingerprint(t, "create-note", 1, p2)
	require.NotEqual(t, f1.Sum, f2.Sum)
	require.Equal(t, []string{"attachment"}, idempotency.DiffFields(f1.Fields(), f2.Fields()))
}

func TestFingerprintActionAndVersion(t *testing.T) {
	t.Parallel()
	base := mustFingerprint(t, "create-note", 1, baseParams())
	require.Equal(t, "create-note", base.Action)
	require.Equal(t, 1, base.Version)
	again := mustFingerprint(t, "create-note", 1, baseParams())
	require.Equal(t, base.Sum, again.Sum)

	for _, tt := range []struct {
		action  string
		version int
	}{
		{"delete-note", 1},
		{"create-note", 2},
		{"create-note", 0},
		{"create-notes", 1},
	} {
		fp := mustFingerprint(t, tt.action, tt.version, baseParams())
		require.NotEqual(t, base.Sum, fp.Sum, "%s v%d", tt.action, tt.version)
		// Parameters are the same, so no parameter differs.
		require.Empty(t, idempotency.DiffFields(base.Fields(), fp.Fields()))
	}
}

func TestFingerprintDoesNotNormaliseStrings(t *testing.T) {
	t.Parallel()
	tests := []struct{ a, b string }{
		{nfcE, nfdE},
		{"a", "a "},
		{"a", " a"},
		{"a\r\nb", "a\nb"},
		{"A", "a"},
		{"\u00c5", "\u212b"}, // Å vs ANGSTROM SIGN (canonically equivalent)
		{"x", "x\u200b"},     // zero-width space
	}
	for _, tt := range tests {
		pa := idempotency.Params{"title": tt.a}
		pb := idempotency.Params{"title": tt.b}
		fa := mustFingerprint(t, "create-note", 1, pa)
		fb := mustFingerprint(t, "create-note", 1, pb)
		require.NotEqual(t, fa.Sum, fb.Sum, "%q vs %q", tt.a, tt.b)
		require.Equal(t, []string{"title"}, idempotency.DiffFields(fa.Fields(), fb.Fields()))
	}
}

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		action  string
		version int
		params  idempotency.Params
		want    string
	}{
		{
			name: "no params", action: "delete-note", version: 1, params: nil,
			want: `{"action":"delete-note","v":1}`,
		},
		{
			name: "sorted and compact", action: "create-note", version: 1, params: baseParams(),
			want: `{"action":"create-note","attachment":null,"body":"milk","title":"Groceries","v":1}`,
		},
		{
			name: "nested objects sorted", action: "create-note", version: 3,
			params: idempotency.Params{"z": map[string]any{"b": 1, "a": []any{"y", "x"}}, "b": "x"},
			want:   `{"action":"create-note","b":"x","v":3,"z":{"a":["y","x"],"b":1}}`,
		},
		{
			name: "NFC kept", action: "create-note", version: 1, params: idempotency.Params{"title": nfcE},
			want: `{"action":"create-note","title":"` + nfcE + `","v":1}`,
		},
		{
			name: "NFD kept", action: "create-note", version: 1, params: idempotency.Params{"title": nfdE},
			want: `{"action":"create-note","title":"` + nfdE + `","v":1}`,
		},
		{
			name: "spaces kept", action: "create-note", version: 1, params: idempotency.Params{"title": "  t  ", "body": "b\n"},
			want: `{"action":"create-note","body":"b\n","title":"  t  ","v":1}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := idempotency.CanonicalJSON(tt.action, tt.version, tt.params)
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
		})
	}
}

func TestFingerprintRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		params idempotency.Params
	}{
		{name: "reserved action", params: idempotency.Params{"title": "t", "action": "delete-note"}},
		{name: "reserved v", params: idempotency.Params{"title": "t", "v": 2}},
		{name: "unmarshalable value", params: idempotency.Params{"title": make(chan int)}},
		// Invalid UTF-8 must not be silently replaced: "\xff" and "\xfe"
		// would otherwise share a fingerprint.
		{name: "invalid UTF-8", params: idempotency.Params{"title": "a\xffb"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := idempotency.NewFingerprint("create-note", 1, tt.params)
			require.Error(t, err)
		})
	}
}

func TestDiffFields(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a, b map[string]string
		want []string
	}{
		{name: "both nil", want: nil},
		{name: "equal", a: map[string]string{"x": "1", "y": "2"}, b: map[string]string{"y": "2", "x": "1"}, want: nil},
		{name: "changed", a: map[string]string{"x": "1", "y": "2"}, b: map[string]string{"x": "1", "y": "3"}, want: []string{"y"}},
		{name: "only in a", a: map[string]string{"x": "1", "y": "2"}, b: map[string]string{"x": "1"}, want: []string{"y"}},
		{name: "only in b", a: map[string]string{"x": "1"}, b: map[string]string{"x": "1", "y": "2"}, want: []string{"y"}},
		{name: "sorted", a: map[string]string{"c": "1", "a": "1", "b": "1"}, b: map[string]string{"c": "2", "a": "2", "b": "2"}, want: []string{"a", "b", "c"}},
		{name: "nil vs some", a: nil, b: map[string]string{"z": "1", "m": "2"}, want: []string{"m", "z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, idempotency.DiffFields(tt.a, tt.b))
		})
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	recorded := mustFingerprint(t, "create-note", 1, baseParams())
	record := func(mod func(r *idempotency.Record)) *idempotency.Record {
		r := &idempotency.Record{
			Tenant: "acme", Key: "k1", Action: "create-note", Version: 1,
			Fingerprint: recorded.Sum, Fields: recorded.Fields(),
			Resource: "/v1/notes/x", Outcome: "created", Body: []byte(`{"id":"x"}`),
			CreatedAt: now.Add(-2 * time.Hour), CompletedAt: now.Add(-2 * time.Hour),
			ExpiresAt: now.Add(time.Hour), ForgetAt: now.Add(24 * time.Hour),
		}
		if mod != nil {
			mod(r)
		}
		return r
	}
	compacted := now.Add(-time.Minute)
	past := func(r *idempotency.Record) { r.ExpiresAt = now.Add(-time.Second) }
	tombstone := func(r *idempotency.Record) {
		r.ExpiresAt = now.Add(-time.Hour)
		r.Body, r.CompactedAt = nil, &compacted
	}
	withParams := func(mod func(p idempotency.Params)) idempotency.Fingerprint {
		p := baseParams()
		mod(p)
		return mustFingerprint(t, "create-note", 1, p)
	}
	changedTitle := withParams(func(p idempotency.Params) { p["title"] = "other" })
	changedTwo := withParams(func(p idempotency.Params) { p["title"] = "other"; p["body"] = "other" })
	otherAction := mustFingerprint(t, "delete-note", 1, baseParams())
	otherVersion := mustFingerprint(t, "create-note", 2, baseParams())

	tests := []struct {
		name       string
		rec        *idempotency.Record
		fp         idempotency.Fingerprint
		at         time.Time
		want       idempotency.Verdict
		wantFields []string
	}{
		{name: "same intent within retention", rec: record(nil), fp: recorded, at: now, want: idempotency.Replay},
		{name: "same intent just before expiry", rec: record(func(r *idempotency.Record) { r.ExpiresAt = now.Add(time.Nanosecond) }), fp: recorded, at: now, want: idempotency.Replay},
		{name: "changed parameter", rec: record(nil), fp: changedTitle, at: now, want: idempotency.Reused, wantFields: []string{"title"}},
		{name: "two changed parameters", rec: record(nil), fp: changedTwo, at: now, want: idempotency.Reused, wantFields: []string{"body", "title"}},
		{name: "another action", rec: record(nil), fp: otherAction, at: now, want: idempotency.Reused, wantFields: []string{"action"}},
		{name: "another action and parameters", rec: record(nil), fp: mustFingerprint(t, "delete-note", 1, idempotency.Params{"id": "y"}), at: now, want: idempotency.Reused, wantFields: []string{"action"}},
		{name: "only the version differs", rec: record(nil), fp: otherVersion, at: now, want: idempotency.Reused, wantFields: []string{"v"}},
		{name: "expired at ExpiresAt", rec: record(func(r *idempotency.Record) { r.ExpiresAt = now }), fp: recorded, at: now, want: idempotency.Expired},
		{name: "expired past ExpiresAt", rec: record(past), fp: recorded, at: now, want: idempotency.Expired},
		{name: "compacted tombstone", rec: record(tombstone), fp: recorded, at: now, want: idempotency.Expired},
		{name: "compacted but within ExpiresAt", rec: record(func(r *idempotency.Record) { r.Body, r.CompactedAt = nil, &compacted }), fp: recorded, at: now, want: idempotency.Expired},
		{name: "nil body", rec: record(func(r *idempotency.Record) { r.Body = nil }), fp: recorded, at: now, want: idempotency.Expired},
		{name: "changed parameter on expired record", rec: record(past), fp: changedTitle, at: now, want: idempotency.Reused, wantFields: []string{"title"}},
		{name: "changed parameter on tombstone", rec: record(tombstone), fp: changedTitle, at: now, want: idempotency.Reused, wantFields: []string{"title"}},
		{name: "another action on tombstone", rec: record(tombstone), fp: otherAction, at: now, want: idempotency.Reused, wantFields: []string{"action"}},
		{name: "another version on tombstone", rec: record(tombstone), fp: otherVersion, at: now, want: idempotency.Reused, wantFields: []string{"v"}},
		{name: "just before ForgetAt", rec: record(tombstone), fp: recorded, at: now.Add(24*time.Hour - time.Nanosecond), want: idempotency.Expired},
		{name: "at ForgetAt", rec: record(tombstone), fp: recorded, at: now.Add(24 * time.Hour), want: idempotency.Forgotten},
		{name: "past ForgetAt", rec: record(tombstone), fp: recorded, at: now.Add(48 * time.Hour), want: idempotency.Forgotten},
		{name: "past ForgetAt with other parameters", rec: record(tombstone), fp: changedTitle, at: now.Add(48 * time.Hour), want: idempotency.Forgotten},
		{name: "past ForgetAt with another action", rec: record(nil), fp: otherAction, at: now.Add(48 * time.Hour), want: idempotency.Forgotten},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, fields := idempotency.Decide(tt.rec, tt.fp, tt.at)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.wantFields, fields)
		})
	}
}
