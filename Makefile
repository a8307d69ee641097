# Thin wrappers: the scripts are the source of truth (CI runs .ci/run -> scripts/test).
.PHONY: setup test demo lint packages image

setup:
	bash scripts/setup

test:
	bash scripts/test

demo:
	bash scripts/demo

lint:
	bash scripts/test --lint-only

packages:
	bash scripts/packages

image:
	bash scripts/image
