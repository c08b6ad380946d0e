module github.com/quillhq/quill/client

go 1.22

require (
	github.com/google/uuid v1.6.0
	github.com/quillhq/quill/contract v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect

replace github.com/quillhq/quill/contract => ../contract
