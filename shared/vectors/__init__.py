"""Vector forms (float, int8, binary, ...): their one declaration, and float rows made into each and back."""
