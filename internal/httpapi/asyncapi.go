package httpapi

import (
	"net/http"

	"github.com/quillhq/quill/api"
)

// getAsyncAPI serves the AsyncAPI document of the event stream, the file
// embedded from api/asyncapi.yaml. It needs no token: a consumer team reads
// it before it has one, and it holds nothing of any tenant.
func getAsyncAPI(w http.ResponseWriter, r *http.Request) {
	writeDocument(w, r, api.ContentType, api.AsyncAPI())
}
