package regional_test

import (
	"testing"

	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/storetest"
)

func TestMemoryStore(t *testing.T) {
	storetest.Run(t, &regional.MemoryStore{})
}

func TestMemoryMarkStore(t *testing.T) {
	storetest.RunMarks(t, &regional.MemoryStore{})
}
