# make test: start real Redis (standalone, Cluster, Redlock nodes, master +
# replica) and PostgreSQL 15 on loopback, vet and run every test of every
# module in go.work with -race (tools/test.sh), stop the services. Nothing
# is skipped.
GO ?= go
TEST_FLAGS ?= -race -count=1 -timeout 20m

.PHONY: test vet services-up services-down demo

test:
	GO=$(GO) TEST_FLAGS='$(TEST_FLAGS)' ./tools/services.sh run ./tools/test.sh

vet:
	$(GO) vet ./...

# For development: services that stay up; `. /tmp/idemguard-dev/env` in a shell.
services-up:
	./tools/services.sh up /tmp/idemguard-dev

services-down:
	./tools/services.sh down /tmp/idemguard-dev

demo:
	$(GO) run ./cmd/idemguard demo
