"""The chaos tests point their marker at tests/chaos/router.yaml (found beside the test file)."""
