package httpapi

import (
	"net/http"
	"strconv"

	"github.com/quillhq/quill/api"
)

// getAsyncAPI serves the AsyncAPI document of the event stream, the file
// embedded from api/asyncapi.yaml. It needs no token: a consumer team reads
// it before it has one, and it holds nothing of any tenant.
func getAsyncAPI(w http.ResponseWriter, r *http.Request) {
	doc := api.AsyncAPI()
	h := w.Header()
	h.Set("Content-Type", api.ContentType)
	h.Set("Content-Length", strconv.Itoa(len(doc)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(doc)
	}
}
