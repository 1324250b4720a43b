module github.com/allot-dev/allot

go 1.26.0

require (
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/time v0.16.0
	pgregory.net/rapid v1.3.0
)
