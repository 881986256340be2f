// The sandbox ("pause") program of the tests' node: the project's own, so no image is pulled.
module vmop.dev/node/pause

go 1.26.0
