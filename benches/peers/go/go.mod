module benchpeers

go 1.19
