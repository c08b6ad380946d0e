package httpapi

import (
	"errors"
	"net/http"
	"strings"

	"github.com/quillhq/quill/api"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/problem"
)

// schemasPattern serves the JSON Schema of each event type's data at
// /schemas/<type>.json (SPEC §5). The mux matches whole segments only, so
// the handler takes the ".json" off itself.
const schemasPattern = "/schemas/{file}"

// getSchema serves the schema that the dataschema of the events of one
// type names, the file embedded from api/schemas, byte for byte. It needs
// no token: a consumer of the stream may hold none of the API's.
func getSchema(w http.ResponseWriter, r *http.Request) {
	typ, ok := strings.CutSuffix(r.PathValue("file"), ".json")
	doc, err := api.Schema(typ)
	if !ok || errors.Is(err, api.ErrUnknownSchema) {
		writeProblem(w, r, problem.New(http.StatusNotFound, contract.CodeNotFound,
			"no event type has this schema; there are /schemas/<type>.json for "+strings.Join(api.SchemaTypes(), ", ")))
		return
	}
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeDocument(w, r, api.SchemaContentType, doc)
}
