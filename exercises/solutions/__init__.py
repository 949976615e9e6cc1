"""Reference solutions of the exercises. Try the exercises first: the tests tell you when you are right."""
