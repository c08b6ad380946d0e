package api

import "github.com/quillhq/quill/contract"

// SchemaContentType is the media type the schemas are served with
// (contract.SchemaContentType).
const SchemaContentType = contract.SchemaContentType

// ErrUnknownSchema is returned for an event type that has no schema
// (contract.ErrUnknownSchema).
var ErrUnknownSchema = contract.ErrUnknownSchema

// Schema returns the JSON Schema of the data of the events of CloudEvents
// type typ, as contract.Schema does: the schemas live in the contract
// module, with the types they describe, so that consumers validate events
// without the server's module. It returns ErrUnknownSchema when there is no
// such type.
func Schema(typ string) ([]byte, error) { return contract.Schema(typ) }

// SchemaTypes returns the CloudEvents types that have a schema, sorted
// (contract.SchemaTypes).
func SchemaTypes() []string { return contract.SchemaTypes() }
