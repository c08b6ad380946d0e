package httpapi

import (
	"strings"
	"testing"

	"github.com/go-json-experiment/json"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/notes"
)

// v2Create is what json v2 decodes b into, as decodeBody's fallback does.
func v2Create(b []byte) (notes.CreateInput, error) {
	var in notes.CreateInput
	err := json.Unmarshal(b, &in, strict)
	return in, err
}

// The bodies clients send are taken without json v2, and decoded as it
// decodes them — through one buffer, as a server's requests share them.
func TestDecodeCreateTakesWhatClientsSend(t *testing.T) {
	t.Parallel()
	var text []byte
	var taken bool
	for _, body := range []string{
		`{}`,
		` { } `,
		`{"title":"groceries","body":"milk, eggs, bread and a bag of coffee beans for the week"}`,
		" \t\r\n{ \"title\" : \"t\" , \"body\" : \"b\" } \n",
		`{"title":null,"body":null,"attachment":null}`,
		`{"title":""}`,
		`{"body":"line one\nline two\ttabbed \"quoted\" back\\slash \/ \u00e9 \ud83d\ude00"}`,
		`{"title":"Café 😀 日本語","body":"\u0000"}`,
		`{"title":"t","body":"b","attachment":{"filename":"a.txt","content_type":"text/plain","data":"QQ=="}}`,
		`{"attachment":{}}`,
		`{"attachment":{"filename":null,"content_type":null,"data":null}}`,
		`{"attachment":{"data":"QQ=="},"title":"after"}`,
		`{"title":"` + strings.Repeat("a", 5000) + `"}`,
	} {
		var got notes.CreateInput
		text, taken = decodeCreate([]byte(body), text, &got)
		require.True(t, taken, "left to json v2: %q", body)
		want, err := v2Create([]byte(body))
		require.NoError(t, err, body)
		require.Equal(t, want, got, body)
	}
}

// What json v2 refuses, or might decode otherwise, is left to it — and so
// is what it would take but decodeCreate does not try to (escaped names).
func TestDecodeCreateLeavesTheRestToJSONv2(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		``, ` `, `null`, `[]`, `"t"`, `1`, "\ufeff{}", `{} {}`, `{}x`, `{}}`, `{`, `}`,
		`{"title":"t",}`, `{"title":"t"`, `{"title":}`, `{"title"}`, `{"title" "t"}`, `{,"title":"t"}`,
		`{'title':'t'}`, `{/* c */"title":"t"}`, `{"title":"t"}// c`,
		`{"title":"a","title":"b"}`, `{"title":null,"title":"b"}`, `{"attachment":{"data":"Q","data":"Q"}}`,
		`{"attachment":null,"attachment":{}}`,
		`{"\u0074itle":"t"}`, `{"title":"a","\u0074itle":"b"}`,
		`{"titel":"t"}`, `{"Title":"t"}`, `{"TITLE":"t"}`, `{"tenant":null}`, `{"attachment":{"size":1}}`,
		`{"title":1}`, `{"title":true}`, `{"title":nul}`, `{"title":nullx}`, `{"title":["t"]}`, `{"title":{}}`,
		`{"attachment":"QQ=="}`, `{"attachment":[]}`, `{"attachment":{"data":1}}`, `{"attachment":{"data":{}}}`,
		"{\"title\":\"a\xffb\"}", "{\"title\":\"\xc0\xaf\"}", "{\"title\":\"\xed\xa0\x80\"}", "{\"\xff\":\"t\"}",
		`{"title":"\ud800"}`, `{"title":"\x"}`, `{"title":"\u12"}`, `{"title":"\`, "{\"title\":\"a\nb\"}",
		"{\"title\":\"a\x00b\"}", `{"title":NaN}`, "{\"title\":\"t\"}\x00",
	} {
		var got notes.CreateInput
		_, taken := decodeCreate([]byte(body), nil, &got)
		require.False(t, taken, "taken: %q", body)
		require.Equal(t, notes.CreateInput{}, got, "a body not taken left its mark: %q", body)
	}
}

// Whatever decodeCreate takes, json v2 takes and decodes the same: the fast
// path never accepts a body the contract refuses, nor reads one otherwise.
func FuzzDecodeCreate(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"title":"t","body":"b","attachment":{"filename":"f","content_type":"text/plain","data":"QQ=="}}`,
		`{"title":null}`, `{"title":"a","title":"b"}`, `{"body":"\n\u00e9\ud83d\ude00"}`, `{"title":"\ud800"}`,
		"{\"title\":\"\xff\"}", `{"x":1}`, `{"attachment":{"data":null}}`, ` {"title" : "t" } `, `{"\u0074itle":"t"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got notes.CreateInput
		if _, taken := decodeCreate(body, nil, &got); !taken {
			require.Equal(t, notes.CreateInput{}, got)
			return
		}
		want, err := v2Create(body)
		require.NoError(t, err, "taken, but json v2 refuses %q", body)
		require.Equal(t, want, got, "%q", body)
	})
}
