package main

import (
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want []string // substrings, in order
	}{
		{
			name: "json line",
			in:   `{"level":"info","process":"relay","time":"2026-11-30T02:00:00.123456Z","message":"published","count":3}` + "\n",
			want: []string{"INF", "relay", "published", "count=3"},
		},
		{name: "plain line kept", in: "ensure-nats: ready\n", want: []string{"ensure-nats: ready\n"}},
		{name: "broken json kept", in: "{not json}\n", want: []string{"{not json}\n"}},
		{name: "no final newline", in: "tail", want: []string{"tail"}},
		{name: "long line kept whole", in: strings.Repeat("x", 200_000) + "\n", want: []string{strings.Repeat("x", 200_000) + "\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out strings.Builder
			if err := run(strings.NewReader(tt.in), &out, false); err != nil {
				t.Fatal(err)
			}
			got := out.String()
			for _, w := range tt.want {
				i := strings.Index(got, w)
				if i < 0 {
					t.Fatalf("output %q lacks %q", got, w)
				}
				got = got[i+len(w):]
			}
			if strings.Contains(out.String(), `"process"`) {
				t.Fatalf("process field repeated: %q", out.String())
			}
		})
	}
}
