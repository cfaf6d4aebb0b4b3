package occ

import (
	"embed"
	"fmt"
	"strings"
	"text/template"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is the SQL that adds to an application's table the columns
// occ needs (Up) and removes them (Down), rendered for one table's names.
// occ ships no tables of its own and keeps no schema-version record: feed
// Up and Down to the migration tool that manages the table (golang-migrate,
// goose, pgstore's style of NNNN_name.up.sql / .down.sql files), or
// run Up once with ExecContext. Up fails on a table that already has the
// column.
type Migration struct {
	Name string // what it does, e.g. "version_column"
	Up   string // adds the column
	Down string // drops it, and the data in it
}

func renderMigration(name string, names map[string]string) (Migration, error) {
	up, err := renderFile("migrations/"+name+".up.sql", names)
	if err != nil {
		return Migration{}, err
	}
	down, err := renderFile("migrations/"+name+".down.sql", names)
	if err != nil {
		return Migration{}, err
	}
	return Migration{Name: name, Up: up, Down: down}, nil
}

func renderFile(file string, names map[string]string) (string, error) {
	b, err := migrationFiles.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("occ: migration %s: %w", file, err)
	}
	tpl, err := template.New(file).Option("missingkey=error").Parse(string(b))
	if err != nil {
		return "", fmt.Errorf("occ: migration %s: %w", file, err)
	}
	var sb strings.Builder
	if err := tpl.Execute(&sb, names); err != nil {
		return "", fmt.Errorf("occ: migration %s: %w", file, err)
	}
	return sb.String(), nil
}
