package redisproto_test

import (
	"fmt"

	"github.com/dlock-go/dlock/redislock/redisproto"
)

// The value of a held lock: owner, token and metadata in one string,
// parsed back by ParseValue (what `dlock ls` and List read).
func ExampleFormatValue() {
	meta, _ := redisproto.EncodeMetadata(map[string]string{"host": "web-1"})
	v := redisproto.FormatValue("0123abcd", 42, meta)
	in := redisproto.ParseValue(v)
	fmt.Println(in.Owner, in.Token, in.Metadata["host"])
	// Output: 0123abcd 42 web-1
}

// Every Redis key of one lock shares its Cluster hash tag; a key that
// would make an empty tag gets a NUL in front, undone by DecodeHashTag.
func ExampleHashTag() {
	for _, k := range []string{"orders/42", "}odd"} {
		tag := redisproto.HashTag(k)
		fmt.Printf("%q -> %q -> %q\n", k, tag, redisproto.DecodeHashTag(tag))
	}
	// Output:
	// "orders/42" -> "orders/42" -> "orders/42"
	// "}odd" -> "\x00}odd" -> "}odd"
}
