-- A version vector per row (occ.VectorTable): a jsonb object from writer id
-- to counter, {"eu-west": 3, "us-east": 12}. Existing rows start at the
-- empty vector. The CHECK keeps out anything occ.Vector cannot read: a
-- non-object, an empty writer id, a counter that is not an integer from 1
-- to 2^64-1.
ALTER TABLE {{.Table}} ADD COLUMN {{.Column}} jsonb NOT NULL DEFAULT '{}'
	CHECK (CASE WHEN jsonb_typeof({{.Column}}) = 'object'
		THEN NOT jsonb_path_exists({{.Column}}, 'strict $.keyvalue() ? (@.key == "" || @.value.type() != "number" || @.value < 1 || @.value > 18446744073709551615 || @.value != @.value.floor())')
		ELSE false END);
